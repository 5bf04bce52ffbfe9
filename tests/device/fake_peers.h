// What the device tests that run real peers share: the fake device runtime installed for
// the life of a test, a failure log peer threads can write to, and peers as threads of
// this process on loopback.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../support/fake_device.h"
#include "runtime/peer.h"

namespace taiji_test {

// Installs the fake as the process's device runtime for the life of the object.
struct FakeInstalled {
  std::shared_ptr<FakeDeviceRuntime> fake = std::make_shared<FakeDeviceRuntime>();
  FakeInstalled();
  ~FakeInstalled();
};

class PeerFailures {
 public:
  void add(int rank, const std::string& what);
  // Reports every line through Catch2; on the test's thread only.
  void check() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

using PeerBody = std::function<void(int rank, taiji::Peer& peer, PeerFailures& failures)>;

// Runs `body` on one peer per entry of `hosts`, one thread each; an entry is that peer's
// host label (TAIJI_HOST), or empty for the default (all on one host).
void run_fake_peers(const std::vector<std::string>& hosts, const std::string& job, const PeerBody& body,
                    PeerFailures& failures, int64_t timeout_ms = 10000);

// Waits for a request at most `ms`; an Internal status when it is still running.
taiji::Status wait_request(const std::shared_ptr<taiji::RequestState>& req, int64_t ms);

}  // namespace taiji_test
