// The two Store backends as tests use them: the embedded rendezvous server on a free
// loopback port, and a real etcd (Debian's etcd-server) that the test program starts once on
// loopback with a data directory of its own. A test asks for a backend by name and opens as
// many clients of one store as it needs; every etcd backend has a prefix of its own.
#pragma once

#include <memory>
#include <string>

#include "bootstrap/store.h"

namespace taiji_test {

class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  // A new client of this backend's store (REQUIREs that it connects).
  virtual std::unique_ptr<taiji::Store> client() = 0;
  // The address open_store takes for it.
  virtual std::string address() const = 0;
};

// "embedded" or "etcd".
std::unique_ptr<StoreBackend> store_backend(const std::string& name);

// The etcd every etcd backend of this program uses: "etcd://127.0.0.1:PORT/<prefix>".
std::string etcd_address(const std::string& prefix);

// A loopback port nothing listens on (bound, read, closed).
int unused_port();

}  // namespace taiji_test
