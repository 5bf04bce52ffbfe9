// A rendezvous server as a handle, for launchers and bindings that publish its address
// their own way (torch's store, say).
#include <taiji/taiji.h>

#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "bootstrap/rendezvous.h"
#include "transport/address.h"

#include "handles.h"

struct taiji_rendezvous {
  std::unique_ptr<taiji::RendezvousServer> server;
  std::string address;
};

namespace {

taiji_status_t refuse(taiji_status_t code, std::string message) {
  taiji_capi::init_error = std::move(message);
  return code;
}

}  // namespace

extern "C" {

taiji_status_t taiji_rendezvous_start(const char* host_port, taiji_rendezvous_t** server) {
  taiji_capi::init_error.clear();
  if (server == nullptr) return refuse(TAIJI_ERR_INVALID_ARGUMENT, "server is NULL");
  *server = nullptr;
  if (host_port == nullptr) return refuse(TAIJI_ERR_INVALID_ARGUMENT, "host_port is NULL");
  try {
    std::string host;
    uint16_t port = 0;
    taiji::Status s = taiji::parse_host_port(host_port, &host, &port, /*allow_zero=*/true);
    if (!s.is_ok()) return refuse(taiji_capi::to_c(s), s.message());
    auto started = taiji::RendezvousServer::start(host, port);
    if (!started.is_ok()) return refuse(taiji_capi::to_c(started.status()), started.status().message());
    auto handle = std::make_unique<taiji_rendezvous>();
    handle->server = std::move(started.value());
    const bool v6 = host.find(':') != std::string::npos;
    handle->address = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(handle->server->port());
    *server = handle.release();
    return TAIJI_OK;
  } catch (const std::bad_alloc&) {
    return refuse(TAIJI_ERR_NO_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return refuse(TAIJI_ERR_INTERNAL, e.what());
  }
}

size_t taiji_rendezvous_address(const taiji_rendezvous_t* server, char* buf, size_t len) {
  const std::string empty;
  const std::string& text = server != nullptr ? server->address : empty;
  if (buf != nullptr && len > 0) {
    const size_t n = text.size() < len - 1 ? text.size() : len - 1;
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return text.size();
}

void taiji_rendezvous_stop(taiji_rendezvous_t* server) { delete server; }

}  // extern "C"
