// The router: the one ReceiveHandler the transports deliver to. It hands each frame to
// the service registered for its message type, and every link loss to every service, so
// that a protocol that is not a collective op lives in its own class instead of inside
// the op engine. Runs on the peer's I/O thread only, like the services it calls.
//
// A new service (model-store requests, membership messages, device-backend sequencing)
// is a ReceiveHandler that registers its frames before the transports start:
//   router.add(MsgType::Query, &service, "taiji.store");   // one reserved name of a type
//   router.add(MsgType::StoreGet, &service);                // or a whole new type
// A new type also needs its number in transport/frame.h (the wire format's list) so that
// decode_header lets it through; a reserved name shares a type without a wire change.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "transport/frame.h"
#include "transport/transport.h"

namespace taiji {

// A service answering a rank's queries skips an answer while this much is already queued
// for that rank: one that asks without reading cannot make this peer queue without bound.
constexpr uint64_t kMaxQueuedForAnswer = 64 << 10;

class Router final : public ReceiveHandler {
 public:
  // Frames of `type` go to `service`; with a name, only frames under that name do, ahead
  // of the type's service without one. One service per (type, name).
  void add(MsgType type, ReceiveHandler* service, std::string name = {});

  // A frame no service takes is a protocol violation: its connection closes.
  Status accept_frame(int src, const FrameHeader& h, const std::string& name,
                      const uint8_t* in_memory, uint8_t** target) override;
  void frame_done(int src, const FrameHeader& h, const std::string& name) override;
  // Every service hears of it, each once, in the order it first registered.
  void link_down(int src, bool graceful, const Status& why) override;

 private:
  struct Route {
    ReceiveHandler* any = nullptr;
    std::vector<std::pair<std::string, ReceiveHandler*>> named;
  };
  ReceiveHandler* service_for(const FrameHeader& h, const std::string& name) const;

  std::array<Route, kMaxMsgType + 1> routes_{};
  std::vector<ReceiveHandler*> services_;
};

}  // namespace taiji
