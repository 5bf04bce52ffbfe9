#include "bootstrap/store_open.h"

#include "bootstrap/etcd_store.h"
#include "bootstrap/rendezvous.h"

namespace taiji {

Result<std::unique_ptr<Store>> open_store(const std::string& address, int64_t timeout_ms) {
  if (address.rfind("etcd://", 0) == 0) {
    auto etcd = EtcdStore::connect(address, timeout_ms);
    if (!etcd.is_ok()) return etcd.status();
    return std::unique_ptr<Store>(std::move(etcd.value()));
  }
  if (address.find("://") != std::string::npos) {
    return Status(Code::InvalidArgument,
                  "store address '" + address + "': unknown scheme (etcd://HOST:PORT/PREFIX or host:port)");
  }
  auto client = RendezvousClient::connect(address, timeout_ms);
  if (!client.is_ok()) {
    if (client.status().message().find("bad address") != std::string::npos) {
      return Status(Code::InvalidArgument, client.status().message());
    }
    return client.status();
  }
  return std::unique_ptr<Store>(std::move(client.value()));
}

}  // namespace taiji
