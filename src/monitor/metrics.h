// The per-peer metrics registry: per op kind and per op name counts, bytes and latency
// histograms; per link byte totals, smoothed throughput and round-trip probes; per step
// times with straggler flags; gauges set by other components; and the flight recorder.
//
// Writers: the I/O thread (op lifecycle, link sampling, probe replies, step results) and
// other components (set_gauge). Readers: any thread (json, prometheus, flight_json). One
// mutex guards everything but the link byte counters (relaxed atomics bumped by the
// transport); an op takes it twice, briefly (start and end), and allocates only the
// first time its name is seen.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "monitor/flight_recorder.h"
#include "monitor/histogram.h"
#include "monitor/link_counters.h"
#include "monitor/refusals.h"
#include "monitor/metric_names.h"

namespace taiji {

// Steady clock, nanoseconds: what every op timing uses.
uint64_t monotonic_ns();

struct OpStart {
  uint8_t kind = 0;               // OpKind value
  const std::string* name = nullptr;
  uint64_t version = 0;
  uint64_t bytes = 0;             // count times element size
  const std::string* strategy = nullptr;
  uint64_t posted_ns = 0;         // when the caller posted it (0: same as started_ns)
  uint64_t started_ns = 0;        // when the I/O thread started it
};

using Labels = std::vector<std::pair<std::string, std::string>>;

class Metrics {
 public:
  // Names beyond max_names are counted together under kOtherName.
  static constexpr size_t kDefaultMaxNames = 1024;
  static constexpr const char* kOtherName = "taiji.other";  // "taiji." names are reserved: no op has it
  // Gauges without a per-name label (the noise scale and its kin) on top of max_names.
  static constexpr size_t kFixedGauges = 64;
  // A rank whose step took more than this times the median (and 1 ms more) straggles.
  static constexpr double kStragglerRatio = 1.5;
  static constexpr int kSchemaVersion = 1;

  Metrics(int rank, int size, size_t flight_capacity, size_t max_names = kDefaultMaxNames);

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Off: ops are neither counted nor recorded (link byte counters still count).
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  // size() counters, one per rank (this rank's stays 0), for the transport.
  LinkCounters* link_counters() { return links_.get(); }
  // Connections refused before they became links, by reason, for the transport.
  RefusalCounters* refusal_counters() { return &refusals_; }
  // Bytes of frames that arrived before their op was posted, held now (I/O thread): the
  // snapshot reports the most ever held at once, to be read against TAIJI_UNEXPECTED_BYTES.
  void note_early_bytes(uint64_t held) {
    if (held > early_bytes_max_.load(std::memory_order_relaxed)) {
      early_bytes_max_.store(held, std::memory_order_relaxed);
    }
  }

  // ---- the op lifecycle (I/O thread) ----
  // Returns a token for op_failed/op_ended; 0 when metrics are off.
  uint64_t op_started(const OpStart& s);
  // The op failed (a timeout, a mismatch): its recorder entry says so at once, even while
  // its buffers are still in use and it has not ended.
  void op_failed(uint64_t token, int32_t code, const std::string& why);
  // `s` as given to op_started: the statistics come from it, so they stay exact when
  // more ops run at once than the flight recorder holds.
  void op_ended(uint64_t token, const OpStart& s, int32_t code, const std::string& why,
                uint64_t ended_ns);

  // Updates each link's smoothed throughput; call periodically (it samples at most
  // once per second).
  void sample_links(uint64_t now_ns);
  // The mean smoothed send rate (bytes per second) of this rank's links to the others: its
  // own view of its throughput, which adaptation compares with a reference.
  double mean_send_rate() const;

  // ---- round-trip probes ----
  // A new probe round: its number. rtt_sending, on the I/O thread, notes when its
  // probes leave, so that the round trip excludes the hop onto that thread.
  uint32_t rtt_begin();
  void rtt_sending(uint32_t round, uint64_t now_ns);
  // I/O thread: the reply of `round` from `peer` arrived.
  void rtt_reply(int peer, uint32_t round, uint64_t now_ns);
  // Waits until every rank in `peers` answered `round`, or timeout_ms (Code::Timeout,
  // naming the ranks still silent).
  Status rtt_wait(uint32_t round, const std::vector<int>& peers, int64_t timeout_ms);

  // ---- steps ----
  // The step that ends now on this rank: seconds since the previous mark (negative for
  // the first mark, which only starts the clock). Restarts the clock.
  double step_end(uint64_t now_ns);
  // Restarts the step clock without ending a step (a blocking mark, once it returns).
  void step_restart(uint64_t now_ns);
  // Every rank's step time (size() values) gathered by the step collective; negative
  // values (a rank's first mark) make the step count for nothing.
  void record_step(const std::vector<double>& seconds);

  // ---- gauges owned by other components ----
  // Sets (creates) the gauge `name` (a Prometheus metric name, e.g. "taiji_grad_norm")
  // with these labels (the rank label is added). False for an invalid name or label, or
  // a new gauge past max_names + kFixedGauges of them.
  bool set_gauge(const std::string& name, const Labels& labels, double value,
                 const std::string& help = "");

  // ---- snapshots (any thread) ----
  std::string json() const;
  std::string prometheus() const;
  std::string flight_json(const std::string& reason) const;
  // Flight recorder dumps written so far (after timeouts).
  void count_dump();

 private:
  struct OpStats {
    uint64_t count = 0;
    uint64_t errors = 0;
    uint64_t bytes = 0;
    LatencyHistogram latency;
    void add(uint64_t bytes_, bool failed, uint64_t ns);
  };
  struct NameStats {
    uint8_t kind = 0;  // of the first op seen under the name
    OpStats stats;
  };
  struct Link {
    uint64_t sampled_sent = 0;
    uint64_t sampled_received = 0;
    double send_rate = 0;  // bytes per second, smoothed
    double receive_rate = 0;
    uint64_t rtt_ns = 0;   // latest probe
    uint64_t rtt_min_ns = 0;
    uint64_t rtt_probes = 0;
    uint32_t rtt_round = 0;  // latest round answered
  };
  struct Gauge {
    std::string name;
    Labels labels;
    std::string help;
    double value = 0;
  };
  struct Steps {
    uint64_t count = 0;
    double median = 0;
    std::vector<double> last;              // per rank
    std::vector<bool> straggler;           // per rank, latest step
    std::vector<uint64_t> straggler_steps;  // per rank, how often flagged
  };

  struct LinkView {
    uint64_t sent = 0;
    uint64_t received = 0;
    uint64_t shm_sent = 0;
    uint64_t read_pauses = 0;
    Link state;
  };
  // A copy taken under the lock, so that formatting (the slow part) runs without it.
  struct View {
    bool enabled = true;
    double uptime_seconds = 0;
    std::vector<OpStats> kinds;
    std::vector<std::pair<std::string, NameStats>> names;  // sorted by name
    NameStats other;
    std::vector<LinkView> links;
    Steps steps;
    std::vector<Gauge> gauges;                              // sorted by name, labels
    uint64_t dumps = 0;
    size_t flight_capacity = 0;
    uint64_t early_bytes_max = 0;
    std::array<uint64_t, kRefusalReasons> refused{};  // by RefusalReason
  };
  View view() const;
  void append_prometheus_ops(std::string& out, const std::string& rank, const View& v) const;
  void append_prometheus_rest(std::string& out, const std::string& rank, const View& v) const;

  const int rank_;
  const int size_;
  const size_t max_names_;
  const uint64_t created_ns_;
  std::atomic<bool> enabled_{true};
  std::unique_ptr<LinkCounters[]> links_;
  std::atomic<uint64_t> early_bytes_max_{0};  // written by the I/O thread only
  RefusalCounters refusals_;

  mutable std::mutex mu_;
  std::condition_variable rtt_cv_;
  std::vector<OpStats> kinds_;                    // by OpKind value
  std::unordered_map<std::string, NameStats> names_;
  NameStats other_;
  FlightRecorder flight_;
  uint64_t dumps_ = 0;
  std::vector<Link> link_state_;
  uint64_t link_sampled_ns_ = 0;
  uint32_t rtt_round_ = 0;
  uint64_t rtt_sent_ns_ = 0;
  uint64_t step_clock_ns_ = 0;                    // 0: no mark yet
  Steps steps_;
  std::map<std::string, Gauge> gauges_;           // by name, then labels
};

}  // namespace taiji
