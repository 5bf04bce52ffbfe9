// Background link probing, opt-in (TAIJI_LINK_PROBE_RATE): while the peer runs, its I/O
// thread probes one link at a time, in turn, with a small Query and then one carrying
// probe_bytes of payload, each answered by the other side as it arrives. The large one's
// round trip less the small one's gives a bandwidth sample; the small one's half, a
// latency sample. A probe starts only after the previous was answered and after enough
// time that everything sent stays within `rate` bytes per second. The samples measure a
// link as training traffic leaves it, so they are noisier than taiji_measure_links on idle
// links: they show change, and taiji_measure_links (or its gather of these rows) builds on
// them. The row is this rank's; gathering rows is the collective's job.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "monitor/metrics.h"
#include "runtime/router.h"

namespace taiji {

class LinkProber final : public ReceiveHandler {
 public:
  static constexpr const char* kName = "taiji.linkprobe";
  // The largest probe accepted from a peer (TAIJI_LINK_PROBE_BYTES's bound).
  static constexpr uint64_t kMaxProbePayload = uint64_t{16} << 20;
  // A probe whose answers have not come by then is given up, and the next one starts.
  static constexpr uint64_t kProbeGiveUpMs = 30000;

  // rate: bytes per second in all (0: never probes); probe_bytes: each large probe.
  LinkProber(int rank, int size, uint64_t rate, uint64_t probe_bytes, Metrics* metrics);
  void set_transport(Transport* transport) { transport_ = transport; }
  void serve(Router& router);
  // I/O thread, on every loop tick: starts the next probe when it is time.
  void tick(uint64_t now_ms);
  // I/O thread: probes may start (every link is up) / no more probes (the peer closes).
  void start() { started_ = true; }
  void stop() { stopped_ = true; }

  // Any thread: this rank's latest samples (smoothed) to each rank; 0 where none yet.
  std::vector<double> bandwidth_row() const;
  std::vector<double> latency_row() const;
  // Any thread: the bytes every probe sent so far (the rate bound's account).
  uint64_t bytes_sent() const;

  Status accept_frame(int src, const FrameHeader& h, const std::string& name, const uint8_t* in_memory,
                      uint8_t** target) override;
  void frame_done(int src, const FrameHeader& h, const std::string& name) override;
  void link_down(int src, bool graceful, const Status& why) override;

 private:
  void send(int dst, uint64_t seq, bool large);
  void sample(int peer, double seconds_small, double seconds_large);

  const int rank_;
  const uint64_t rate_;
  const uint64_t probe_bytes_;
  Metrics* metrics_;
  Transport* transport_ = nullptr;
  std::vector<uint8_t> payload_;  // zeros, borrowed by every large probe

  // I/O thread only.
  bool started_ = false;
  bool stopped_ = false;
  std::vector<bool> gone_;  // ranks whose link went down
  int next_ = 0;            // the next rank to probe
  int target_ = -1;         // the rank probed now; -1: none outstanding
  uint64_t seq_ = 0;        // the probe's number (op_version: 2 seq small, 2 seq + 1 large)
  uint64_t sent_small_ns_ = 0, sent_large_ns_ = 0, answered_small_ns_ = 0;
  uint64_t next_start_ms_ = 0;
  uint64_t started_ms_ = 0;

  mutable std::mutex mu_;
  std::vector<double> bandwidth_;  // under mu_
  std::vector<double> latency_;    // under mu_
  uint64_t bytes_sent_ = 0;        // under mu_
};

}  // namespace taiji
