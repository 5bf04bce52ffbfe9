// Opens the store an address names: "etcd://HOST:PORT/PREFIX" is etcd (bootstrap/etcd_store.h),
// "host:port" the embedded rendezvous server (bootstrap/rendezvous.h).
#pragma once

#include <memory>
#include <string>

#include "bootstrap/store.h"

namespace taiji {

// Code::InvalidArgument naming a malformed address; Code::Bootstrap when the store does
// not answer within timeout_ms.
Result<std::unique_ptr<Store>> open_store(const std::string& address, int64_t timeout_ms);

}  // namespace taiji
