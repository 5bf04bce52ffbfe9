#include "runtime/router.h"

#include <algorithm>

namespace taiji {

void Router::add(MsgType type, ReceiveHandler* service, std::string name) {
  Route& route = routes_[static_cast<uint8_t>(type)];
  if (name.empty()) {
    route.any = service;
  } else {
    route.named.emplace_back(std::move(name), service);
  }
  if (std::find(services_.begin(), services_.end(), service) == services_.end()) {
    services_.push_back(service);
  }
}

ReceiveHandler* Router::service_for(const FrameHeader& h, const std::string& name) const {
  const auto type = static_cast<uint8_t>(h.type);
  if (type >= routes_.size()) return nullptr;
  const Route& route = routes_[type];
  for (const auto& [reserved, service] : route.named) {
    if (reserved == name) return service;
  }
  return route.any;
}

Status Router::accept_frame(int src, const FrameHeader& h, const std::string& name,
                            const uint8_t* in_memory, uint8_t** target) {
  ReceiveHandler* service = service_for(h, name);
  if (service == nullptr) {
    *target = nullptr;
    return {Code::Protocol, "unexpected frame type"};
  }
  return service->accept_frame(src, h, name, in_memory, target);
}

void Router::frame_done(int src, const FrameHeader& h, const std::string& name) {
  if (ReceiveHandler* service = service_for(h, name)) service->frame_done(src, h, name);
}

void Router::link_down(int src, bool graceful, const Status& why) {
  for (ReceiveHandler* service : services_) service->link_down(src, graceful, why);
}

}  // namespace taiji
