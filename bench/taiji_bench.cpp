// taiji-bench: nccl-tests style sweep of one collective over message sizes. Every process
// of the job runs it (normally under `taiji-run -np N`); rank 0 prints the table.
#include <taiji/taiji.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "bench.h"

namespace taiji_bench {
namespace {

constexpr uint64_t kSmallBytes = 1ull << 20;  // larger sizes get the shorter warmup
constexpr double kTargetSecondsPerSize = 0.3;
constexpr int kMinAdaptiveIters = 5;
constexpr int kMaxAdaptiveIters = 1000;

// A library call that failed; carries what taiji_peer_last_error said right then.
struct LibError {
  taiji_status_t status;
  std::string call;
  std::string detail;
};

// --help and usage errors happen before the peer exists, so the rank is read the way the
// library would; otherwise `taiji-run -np 8 taiji-bench --help` prints the text 8 times.
bool env_says_rank_zero() {
  static const char* const kRankVars[] = {"TAIJI_RANK", "RANK", "OMPI_COMM_WORLD_RANK",
                                          "SLURM_PROCID"};
  for (const char* var : kRankVars) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return std::strcmp(v, "0") == 0;
  }
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

class Bench {
 public:
  Bench(taiji_peer_t* peer, const Options& o) : peer_(peer), o_(o) {
    rank_ = taiji_peer_rank(peer);
    world_ = taiji_peer_size(peer);
    opts_.timeout_ms = o.timeout_ms;
    // A per-op topology would override the swapped one, so a swap run leaves the choice
    // to the peer and starts it on --topology through the config instead.
    if (!o.swap_at) use_topology(o.topology);
    if (o.metrics == MetricsMode::kOn || o.metrics == MetricsMode::kOff) {
      ok(taiji_metrics_set_enabled(peer_, o.metrics == MetricsMode::kOn ? 1 : 0),
         "taiji_metrics_set_enabled");
    }
  }

  // Runs every later op on `name` (empty: the peer's choice). Op names then carry it, so
  // an error message says which strategy's sweep failed.
  void use_topology(const std::string& name) {
    topology_ = name;
    opts_.topology = topology_.empty() ? nullptr : topology_.c_str();
    tag_prefix_ = topology_.empty() ? "" : topology_ + ".";
  }

  int rank() const { return rank_; }
  int world() const { return world_; }

  // The byte sizes of the sweep, rounded down to whole elements, without duplicates or
  // empty messages (a 4-byte request means nothing for f64).
  std::vector<uint64_t> sizes() const {
    if (o_.op == OpKind::kBarrier) return {0};
    const uint64_t elem = o_.dtype->size;
    std::vector<uint64_t> out;
    uint64_t b = o_.min_bytes;
    while (true) {
      uint64_t rounded = b / elem * elem;
      if ((rounded > 0 || b == 0) && (out.empty() || out.back() != rounded)) {
        out.push_back(rounded);
      }
      if (b == 0) {
        b = 1;
      } else {
        if (b > o_.max_bytes / o_.step_factor) break;
        b *= o_.step_factor;
      }
      if (b > o_.max_bytes) break;
    }
    return out;
  }

  void allocate(uint64_t max_bytes) {
    size_t n = static_cast<size_t>(std::max<uint64_t>(max_bytes, 1));
    send_ = std::make_unique<unsigned char[]>(n);
    recv_ = std::make_unique<unsigned char[]>(n);
  }

  Row run_size(uint64_t bytes) {
    Row row;
    row.bytes = bytes;
    row.count = o_.op == OpKind::kBarrier ? 0 : static_cast<size_t>(bytes / o_.dtype->size);
    row.warmup = o_.warmup.value_or(bytes <= kSmallBytes ? 5 : 2);
    row.has_bandwidth = o_.op != OpKind::kBarrier;
    const std::string tag = tag_prefix_ + std::to_string(bytes);
    const std::string op_name_str = std::string("bench.") + op_name(o_.op) + "." + tag;

    prepare_timed_inputs(row.count, bytes);
    barrier("bench.sync." + tag);

    std::vector<double> warm(static_cast<size_t>(row.warmup));
    for (double& t : warm) {
      auto start = std::chrono::steady_clock::now();
      run_op(op_name_str.c_str(), row.count);
      t = seconds_since(start);
    }
    row.iters = o_.iters ? *o_.iters : adaptive_iters(warm, bytes, tag);

    // --metrics both: even iterations run with metrics off, odd ones on, so that both
    // see the same drift in machine load.
    const bool compare = o_.metrics == MetricsMode::kBoth;
    if (compare) row.iters += row.iters % 2;
    std::vector<double> times(static_cast<size_t>(row.iters));
    for (size_t i = 0; i < times.size(); ++i) {
      // The last timed op writes into a cleared output (outside the timer), so that the
      // check reads what a timed op wrote, not what the warmup left.
      if (i + 1 == times.size() && i > 0) prepare_timed_inputs(row.count, bytes);
      if (compare) ok(taiji_metrics_set_enabled(peer_, static_cast<int>(i % 2)), "taiji_metrics_set_enabled");
      auto start = std::chrono::steady_clock::now();
      run_op(op_name_str.c_str(), row.count);
      times[i] = seconds_since(start);
    }
    if (compare) ok(taiji_metrics_set_enabled(peer_, 1), "taiji_metrics_set_enabled");
    // Peers' clocks are not compared: each iteration counts as long as it took on the
    // slowest peer, which is what a training step waiting on the op would see.
    allreduce("bench.times." + tag, times.data(), times.size(), TAIJI_F64, TAIJI_MAX);
    if (compare) {
      std::vector<double> off;
      std::vector<double> on;
      for (size_t i = 0; i < times.size(); ++i) (i % 2 ? on : off).push_back(times[i]);
      row.compared = true;
      row.off_us = median(off) * 1e6;
      row.on_us = median(on) * 1e6;
    }

    row.time_us = median(times) * 1e6;
    row.min_us = *std::min_element(times.begin(), times.end()) * 1e6;
    row.max_us = *std::max_element(times.begin(), times.end()) * 1e6;
    if (row.has_bandwidth) bandwidths(bytes, row.time_us, &row.algbw_gbps, &row.busbw_gbps);
    if (o_.check && o_.op != OpKind::kBarrier) {
      row.check = check(row.count, bytes, tag) ? "ok" : "FAIL";
    }
    row.topology = topology_;
    return row;
  }

  // The swap run: warmup, then o_.iters timed iterations of one size with a collective
  // taiji_set_topology(to) before iteration swap_at. Every iteration's result is checked
  // outside its timed region, and the digest each op ran on is recorded, so both the
  // switch and the recovery after it can be seen.
  SwapResult run_swap(uint64_t bytes, const std::string& from) {
    SwapResult r;
    r.from = from;
    const int iters = o_.iters.value_or(kDefaultSwapIters);
    const bool data = o_.op != OpKind::kBarrier;
    r.bytes = data ? bytes / o_.dtype->size * o_.dtype->size : 0;
    r.count = data ? static_cast<size_t>(bytes / o_.dtype->size) : 0;
    r.warmup = o_.warmup.value_or(r.bytes <= kSmallBytes ? 5 : 2);
    r.swap_at = *o_.swap_at;
    r.to = o_.swap_to;
    r.to_digest = digest_of(o_.swap_to);
    const std::string op_name_str = std::string("bench.") + op_name(o_.op) + ".swap";
    const bool checking = o_.check && data;

    prepare_timed_inputs(r.count, r.bytes);
    barrier("bench.sync.swap");
    for (int i = 0; i < r.warmup; ++i) run_op(op_name_str.c_str(), r.count);

    std::vector<double> times(static_cast<size_t>(iters));
    std::vector<uint64_t> digests(static_cast<size_t>(iters));
    std::vector<uint64_t> digests_low(static_cast<size_t>(iters));
    std::vector<int32_t> pass(static_cast<size_t>(iters), 1);
    double swap_seconds = 0;
    for (int i = 0; i < iters; ++i) {
      if (i == r.swap_at) {
        // Peers leave the last check at different times; without it the swap's time would
        // mostly be the wait for the slowest of them.
        barrier("bench.preswap");
        swap_seconds = swap_topology(&r.swap_digest);
      }
      if (checking) reset_output(r.bytes);
      // Without it, an iteration would also time the skew the previous check left.
      barrier("bench.iter.swap");
      auto start = std::chrono::steady_clock::now();
      taiji_request_t* req = nullptr;
      taiji_status_t s = post_op(op_name_str.c_str(), r.count, &req);
      if (s == TAIJI_OK) s = taiji_request_wait(req, -1);
      times[i] = seconds_since(start);
      digests[i] = digests_low[i] = taiji_request_topology_digest(req);
      taiji_request_free(req);
      if (s != TAIJI_OK) ok(s, std::string("taiji_") + op_name(o_.op) + "(" + op_name_str + ")");
      if (checking && !verify_output(r.count, r.bytes, 0)) pass[i] = 0;
    }
    allreduce("bench.times.swap", times.data(), times.size(), TAIJI_F64, TAIJI_MAX);
    allreduce("bench.swaptime.swap", &swap_seconds, 1, TAIJI_F64, TAIJI_MAX);
    // Every peer must have run each iteration on the same graphs; a disagreement fails
    // the iteration's check like a wrong result would.
    allreduce("bench.digest.max", digests.data(), digests.size(), TAIJI_U64, TAIJI_MAX);
    allreduce("bench.digest.min", digests_low.data(), digests_low.size(), TAIJI_U64, TAIJI_MIN);
    allreduce("bench.flags.swap", pass.data(), pass.size(), TAIJI_I32, TAIJI_MIN);
    r.swap_us = swap_seconds * 1e6;
    for (int i = 0; i < iters; ++i) {
      Sample smp;
      smp.iter = i;
      smp.time_us = times[i] * 1e6;
      if (data) bandwidths(r.bytes, smp.time_us, &smp.algbw_gbps, &smp.busbw_gbps);
      smp.digest = digests[i];
      smp.topology = digest_name(digests[i], i < r.swap_at ? r.from : r.to);
      const bool agree = digests[i] == digests_low[i];
      if (!agree && rank_ == 0) {
        std::fprintf(stderr, "taiji-bench: iteration %d ran on different topologies on different "
                             "peers\n", i);
      }
      if (checking) {
        smp.check = pass[i] == 1 && agree ? "ok" : "FAIL";
      } else if (!agree) {
        smp.check = "FAIL";
      }
      r.samples.push_back(smp);
    }
    return r;
  }

  // Digests of the built-ins as built for this job, so a run's digest can be named.
  void learn_digests() {
    for (std::string_view view : builtin_topologies()) {
      const std::string name(view);
      taiji_topology_t* t = nullptr;
      taiji_status_t s = taiji_topology_from_text(peer_, name.c_str(), 0, &t);
      if (s != TAIJI_OK) {
        throw LibError{s, "taiji_topology_from_text(" + name + ")",
                       taiji_peer_last_error(nullptr)};
      }
      digest_names_.emplace_back(taiji_topology_digest(t), name);
      taiji_topology_destroy(t);
    }
  }

  uint64_t digest_of(const std::string& name) const {
    for (const auto& [d, n] : digest_names_) {
      if (n == name) return d;
    }
    return 0;
  }

  // Several built-ins can coincide (tree and binary_tree_star always do; with one rank
  // per host hierarchical is ring; with three ranks star is tree), so the name the run
  // asked for is tried first.
  std::string digest_name(uint64_t digest, const std::string& preferred) const {
    if (!preferred.empty() && digest_of(preferred) == digest) return preferred;
    for (const auto& [d, name] : digest_names_) {
      if (d == digest) return name;
    }
    return "?";
  }

 private:
  void bandwidths(uint64_t bytes, double time_us, double* algbw, double* busbw) const {
    if (time_us <= 0) return;
    *algbw = static_cast<double>(bytes) / (time_us * 1e-6) / 1e9;
    *busbw = o_.op == OpKind::kAllreduce ? *algbw * 2.0 * (world_ - 1) / world_ : *algbw;
  }

  // A collective: every peer calls it at the same point of its op stream. Returns this
  // peer's time from posting to completion.
  double swap_topology(uint64_t* digest) {
    taiji_topology_t* t = nullptr;
    taiji_status_t s = taiji_topology_from_text(peer_, o_.swap_to.c_str(), 0, &t);
    if (s != TAIJI_OK) {
      throw LibError{s, "taiji_topology_from_text(" + o_.swap_to + ")",
                     taiji_peer_last_error(nullptr)};
    }
    taiji_op_options_t opts = TAIJI_OP_OPTIONS_INIT;
    opts.timeout_ms = o_.timeout_ms;
    taiji_request_t* req = nullptr;
    auto start = std::chrono::steady_clock::now();
    s = taiji_set_topology(peer_, t, &opts, &req);
    taiji_topology_destroy(t);
    if (s == TAIJI_OK) s = taiji_request_wait(req, -1);
    double elapsed = seconds_since(start);
    *digest = taiji_request_topology_digest(req);
    taiji_request_free(req);
    ok(s, "taiji_set_topology(" + o_.swap_to + ")");
    return elapsed;
  }

  // Output buffers start from data no correct op leaves behind, so an op that delivered
  // nothing cannot pass.
  void reset_output(uint64_t bytes) {
    if (o_.op == OpKind::kAllreduce) {
      std::memset(recv_.get(), 0xff, static_cast<size_t>(bytes));
    } else if (o_.op == OpKind::kBroadcast && rank_ != o_.root) {
      fill_broadcast_pattern(0, true, recv_.get(), static_cast<size_t>(bytes));
    }
  }

  bool verify_output(size_t count, uint64_t bytes, uint64_t seed) const {
    if (o_.op == OpKind::kAllreduce) {
      return verify_allreduce_output(*o_.dtype, o_.redop, world_, seed, recv_.get(), count);
    }
    return verify_broadcast_pattern(seed, recv_.get(), static_cast<size_t>(bytes));
  }

  void ok(taiji_status_t s, const std::string& call) {
    if (s != TAIJI_OK) throw LibError{s, call, taiji_peer_last_error(peer_)};
  }

  void barrier(const std::string& name) {
    ok(taiji_barrier(peer_, name.c_str(), &opts_, nullptr), "taiji_barrier(" + name + ")");
  }

  void allreduce(const std::string& name, void* buf, size_t count, taiji_dtype_t dt,
                 taiji_reduce_op_t op) {
    ok(taiji_allreduce(peer_, name.c_str(), buf, buf, count, dt, op, &opts_, nullptr),
       "taiji_allreduce(" + name + ")");
  }

  taiji_status_t post_op(const char* name, size_t count, taiji_request_t** req) {
    switch (o_.op) {
      case OpKind::kAllreduce:
        return taiji_allreduce(peer_, name, send_.get(), recv_.get(), count, o_.dtype->dtype,
                               o_.redop, &opts_, req);
      case OpKind::kBroadcast:
        return taiji_broadcast(peer_, name, recv_.get(), count, o_.dtype->dtype, o_.root,
                               &opts_, req);
      case OpKind::kBarrier:
        return taiji_barrier(peer_, name, &opts_, req);
    }
    return TAIJI_ERR_INVALID_ARGUMENT;
  }

  // The timed call itself; errors are only formatted on the failure path so that the
  // loop does no string work.
  void run_op(const char* name, size_t count) {
    taiji_status_t s = post_op(name, count, nullptr);
    if (s != TAIJI_OK) ok(s, std::string("taiji_") + op_name(o_.op) + "(" + name + ")");
  }

  // Timed ops use seed-0 data, so the last timed result can be checked as well.
  void prepare_timed_inputs(size_t count, uint64_t bytes) {
    if (o_.op == OpKind::kAllreduce) {
      fill_allreduce_input(*o_.dtype, o_.redop, rank_, world_, 0, send_.get(), count);
      std::memset(recv_.get(), 0xff, static_cast<size_t>(bytes));
    } else if (o_.op == OpKind::kBroadcast) {
      fill_broadcast_pattern(0, rank_ != o_.root, recv_.get(), static_cast<size_t>(bytes));
    }
  }

  // Every peer must run the same number of iterations, so the choice is made from the
  // slowest peer's warmup time, which all of them learn from one allreduce.
  int adaptive_iters(const std::vector<double>& warm, uint64_t bytes, const std::string& tag) {
    double per_op = 0;
    if (warm.size() > 1) {
      // The first warmup op pays for connection and buffer set-up; leave it out.
      per_op = median(std::vector<double>(warm.begin() + 1, warm.end()));
    } else if (!warm.empty()) {
      per_op = warm[0];
    } else {
      // No warmup to learn from: assume roughly 1 GB/s plus 100 us of latency.
      per_op = 100e-6 + static_cast<double>(bytes) / 1e9;
    }
    allreduce("bench.calib." + tag, &per_op, 1, TAIJI_F64, TAIJI_MAX);
    double want = kTargetSecondsPerSize / std::max(per_op, 1e-9);
    return static_cast<int>(std::clamp(std::ceil(want), double{kMinAdaptiveIters},
                                       double{kMaxAdaptiveIters}));
  }

  // Verifies the last timed op's output, then one more op of the same shape, run in
  // place with other data so that a result left over from the timed loop cannot pass.
  // The row is "ok" only if every peer's checks passed.
  bool check(size_t count, uint64_t bytes, const std::string& tag) {
    const std::string name = "bench.check." + tag;
    const size_t nbytes = static_cast<size_t>(bytes);
    int32_t pass = 1;
    if (o_.op == OpKind::kAllreduce) {
      if (!verify_allreduce_output(*o_.dtype, o_.redop, world_, 0, recv_.get(), count)) pass = 0;
      fill_allreduce_input(*o_.dtype, o_.redop, rank_, world_, 1, recv_.get(), count);
      ok(taiji_allreduce(peer_, name.c_str(), recv_.get(), recv_.get(), count, o_.dtype->dtype,
                         o_.redop, &opts_, nullptr),
         "taiji_allreduce(" + name + ")");
      if (!verify_allreduce_output(*o_.dtype, o_.redop, world_, 1, recv_.get(), count)) pass = 0;
    } else {
      if (!verify_broadcast_pattern(0, recv_.get(), nbytes)) pass = 0;
      fill_broadcast_pattern(1, rank_ != o_.root, recv_.get(), nbytes);
      ok(taiji_broadcast(peer_, name.c_str(), recv_.get(), count, o_.dtype->dtype, o_.root,
                         &opts_, nullptr),
         "taiji_broadcast(" + name + ")");
      if (!verify_broadcast_pattern(1, recv_.get(), nbytes)) pass = 0;
    }
    if (pass == 0) {
      std::fprintf(stderr, "taiji-bench: rank %d: wrong %s result at %llu bytes\n", rank_,
                   op_name(o_.op), static_cast<unsigned long long>(bytes));
    }
    allreduce("bench.flag." + tag, &pass, 1, TAIJI_I32, TAIJI_MIN);
    return pass == 1;
  }

  taiji_peer_t* peer_;
  const Options& o_;
  int rank_ = 0;
  int world_ = 1;
  taiji_op_options_t opts_ = TAIJI_OP_OPTIONS_INIT;
  std::string topology_;
  std::string tag_prefix_;
  std::vector<std::pair<uint64_t, std::string>> digest_names_;
  std::unique_ptr<unsigned char[]> send_;
  std::unique_ptr<unsigned char[]> recv_;
};

// The topology the peer starts on, as shown: --topology, else TAIJI_TOPOLOGY, else auto.
std::string start_topology(const Options& o) {
  if (!o.topology.empty()) return o.topology;
  const char* env = std::getenv("TAIJI_TOPOLOGY");
  return env != nullptr && *env != '\0' ? env : "auto";
}

std::string shown_topology(const Options& o) {
  if (!o.sweep_topologies.empty()) {
    std::string list = "sweep:";
    for (const std::string& t : o.sweep_topologies) list += (list.back() == ':' ? "" : ",") + t;
    return list;
  }
  return o.swap_at ? start_topology(o) + "->" + o.swap_to : start_topology(o);
}

// Writes the optional files; false if one could not be written.
bool write_files(const Options& o, const RunInfo& info, const std::vector<Row>& rows,
                 const SwapResult* swap, bool all_ok) {
  std::string error;
  bool good = true;
  if (!o.csv_path.empty() &&
      !(swap ? write_timeline_csv(o.csv_path, info, *swap, &error)
             : write_csv(o.csv_path, info, rows, &error))) {
    std::fprintf(stderr, "taiji-bench: %s\n", error.c_str());
    good = false;
  }
  if (!o.json_path.empty() &&
      !(swap ? write_timeline_json(o.json_path, info, *swap, all_ok, &error)
             : write_json(o.json_path, info, rows, all_ok, &error))) {
    std::fprintf(stderr, "taiji-bench: %s\n", error.c_str());
    good = false;
  }
  return good;
}

bool any_failed(const std::vector<Row>& rows) {
  return std::any_of(rows.begin(), rows.end(),
                     [](const Row& r) { return std::strcmp(r.check, "FAIL") == 0; });
}

int run(const Options& o) {
  if (o.fusion_ops > 0) return run_fusion_test(o);
  taiji_config_t cfg = TAIJI_CONFIG_INIT;
  if (!o.topology.empty()) cfg.topology = o.topology.c_str();
  taiji_peer_t* peer = nullptr;
  taiji_status_t s = taiji_peer_init(&cfg, &peer);
  if (s != TAIJI_OK) {
    std::fprintf(stderr, "taiji-bench: taiji_peer_init failed: %s: %s\n", taiji_status_name(s),
                 taiji_peer_last_error(nullptr));
    return 2;
  }

  Bench bench(peer, o);
  const int rank = bench.rank();
  if (o.op == OpKind::kBroadcast && o.root >= bench.world()) {
    if (rank == 0) {
      std::fprintf(stderr, "taiji-bench: --root %d is not below the world size %d\n", o.root,
                   bench.world());
    }
    taiji_peer_destroy(peer);
    return 2;
  }

  RunInfo info;
  info.options = &o;
  info.world = bench.world();
  info.topology = shown_topology(o);
  info.version = taiji_version_string();

  std::vector<Row> rows;                    // plain run, and every sweep row in order
  std::vector<std::vector<Row>> per_topo;  // sweep run
  std::vector<uint64_t> sweep_digests;
  SwapResult swap;
  bool all_ok = true;
  int code = 0;
  try {
    if (o.swap_at) {
      bench.learn_digests();
      bench.allocate(o.op == OpKind::kBarrier ? 0 : o.max_bytes);
      if (rank == 0) print_header(info);
      swap = bench.run_swap(o.max_bytes, start_topology(o));
      for (const Sample& smp : swap.samples) {
        if (std::strcmp(smp.check, "FAIL") == 0) all_ok = false;
      }
    } else {
      const std::vector<uint64_t> sizes = bench.sizes();
      bench.allocate(sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end()));
      if (rank == 0) print_header(info);
      if (o.sweep_topologies.empty()) {
        for (uint64_t bytes : sizes) {
          Row row = bench.run_size(bytes);
          rows.push_back(row);
          if (rank == 0) print_row(info, row);
        }
      } else {
        bench.learn_digests();
        for (const std::string& topo : o.sweep_topologies) {
          sweep_digests.push_back(bench.digest_of(topo));
        }
        for (const std::string& topo : o.sweep_topologies) {
          bench.use_topology(topo);
          auto start = std::chrono::steady_clock::now();
          std::vector<Row> mine;
          for (uint64_t bytes : sizes) mine.push_back(bench.run_size(bytes));
          if (rank == 0) {
            std::printf("# %-22s %zu sizes in %.1f s%s\n", topo.c_str(), mine.size(),
                        seconds_since(start), any_failed(mine) ? ", CHECK FAILED" : "");
            std::fflush(stdout);
          }
          rows.insert(rows.end(), mine.begin(), mine.end());
          per_topo.push_back(std::move(mine));
        }
      }
      all_ok = !any_failed(rows);
    }
    s = taiji_peer_finalize(peer);
    if (s != TAIJI_OK) throw LibError{s, "taiji_peer_finalize", taiji_peer_last_error(peer)};
    code = all_ok ? 0 : 1;
  } catch (const LibError& e) {
    std::fprintf(stderr, "taiji-bench: rank %d: %s failed: %s: %s\n", rank, e.call.c_str(),
                 taiji_status_name(e.status), e.detail.c_str());
    // Closing the connections at once lets the other peers fail fast with a lost peer
    // instead of waiting out the op timeout.
    taiji_peer_abort(peer);
    code = 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "taiji-bench: rank %d: out of memory for the message buffers\n", rank);
    taiji_peer_abort(peer);
    code = 2;
  }
  taiji_peer_destroy(peer);

  if (rank == 0 && code != 2) {
    if (o.swap_at) {
      print_timeline(info, swap, all_ok);
    } else if (!o.sweep_topologies.empty()) {
      print_sweep_table(info, o.sweep_topologies, sweep_digests, per_topo, all_ok);
    } else {
      print_footer(info, rows, all_ok);
      if (o.metrics == MetricsMode::kBoth) print_metrics_comparison(info, rows);
    }
    if (!write_files(o, info, rows, o.swap_at ? &swap : nullptr, all_ok)) code = 2;
  }
  return code;
}

}  // namespace
}  // namespace taiji_bench

int main(int argc, char** argv) {
  using namespace taiji_bench;
  Options o;
  std::string error;
  switch (parse_options(argc, argv, &o, &error)) {
    case ParseResult::kHelp:
      if (env_says_rank_zero()) print_usage();
      return 0;
    case ParseResult::kError:
      if (env_says_rank_zero()) std::fprintf(stderr, "taiji-bench: %s\n", error.c_str());
      return 2;
    case ParseResult::kRun:
      break;
  }
  return run(o);
}
