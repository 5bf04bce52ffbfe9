#include "transport/transport_stack.h"

namespace taiji {

TransportStack::TransportStack(uv_loop_t* loop, TcpOptions tcp, ShmOptions shm,
                               ReceiveHandler* handler)
    : tcp_(std::make_unique<TcpTransport>(loop, std::move(tcp), nullptr)) {
  shm_ = std::make_unique<ShmTransport>(std::move(shm), tcp_.get(), handler);
  tcp_->set_handler(shm_.get());
}

TransportStack::~TransportStack() = default;

void TransportStack::connect(std::vector<std::string> addresses, std::vector<int> host_of,
                             uint64_t timeout_ms, std::function<void(const Status&)> on_ready) {
  tcp_->connect_all(std::move(addresses), timeout_ms,
                    [this, host_of = std::move(host_of), on_ready = std::move(on_ready)](const Status& s) {
                      if (s.is_ok()) shm_->start(host_of);
                      on_ready(s);
                    });
}

}  // namespace taiji
