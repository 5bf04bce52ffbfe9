// Round-trip probes: a Query under the reserved name kName, with the round in op_version,
// that every peer answers at once; the Answer's arrival time goes to the metrics. It
// shares the stall watchdog's message types on the wire, so it registers by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "monitor/metrics.h"
#include "runtime/router.h"

namespace taiji {

class RttProbes final : public ReceiveHandler {
 public:
  // No op has it: names under "taiji." are refused to callers, and the runtime posts none by it.
  static constexpr const char* kName = "taiji.probe";

  RttProbes(int rank, int size, Metrics* metrics);
  void set_transport(Transport* transport) { transport_ = transport; }
  void serve(Router& router);
  // Probes every other rank that has not finalized.
  void send(uint32_t round);

  Status accept_frame(int src, const FrameHeader& h, const std::string& name,
                      const uint8_t* in_memory, uint8_t** target) override;
  void frame_done(int src, const FrameHeader& h, const std::string& name) override;
  void link_down(int src, bool graceful, const Status& why) override;

 private:
  int rank_;
  Metrics* metrics_;
  Transport* transport_ = nullptr;
  std::vector<bool> departed_;  // ranks that finalized (said Bye)
};

}  // namespace taiji
