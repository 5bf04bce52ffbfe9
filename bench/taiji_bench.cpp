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
    opts_.topology = o.topology.empty() ? nullptr : o.topology.c_str();
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
    const std::string tag = std::to_string(bytes);
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

    std::vector<double> times(static_cast<size_t>(row.iters));
    for (double& t : times) {
      auto start = std::chrono::steady_clock::now();
      run_op(op_name_str.c_str(), row.count);
      t = seconds_since(start);
    }
    // Peers' clocks are not compared: each iteration counts as long as it took on the
    // slowest peer, which is what a training step waiting on the op would see.
    allreduce("bench.times." + tag, times.data(), times.size(), TAIJI_F64, TAIJI_MAX);

    row.time_us = median(times) * 1e6;
    row.min_us = *std::min_element(times.begin(), times.end()) * 1e6;
    row.max_us = *std::max_element(times.begin(), times.end()) * 1e6;
    if (row.has_bandwidth && row.time_us > 0) {
      row.algbw_gbps = static_cast<double>(bytes) / (row.time_us * 1e-6) / 1e9;
      row.busbw_gbps = o_.op == OpKind::kAllreduce
                           ? row.algbw_gbps * 2.0 * (world_ - 1) / world_
                           : row.algbw_gbps;
    }
    if (o_.check && o_.op != OpKind::kBarrier) {
      row.check = check(row.count, bytes, tag) ? "ok" : "FAIL";
    }
    return row;
  }

 private:
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

  // The timed call itself; errors are only formatted on the failure path so that the
  // loop does no string work.
  void run_op(const char* name, size_t count) {
    taiji_status_t s = TAIJI_OK;
    switch (o_.op) {
      case OpKind::kAllreduce:
        s = taiji_allreduce(peer_, name, send_.get(), recv_.get(), count, o_.dtype->dtype,
                            o_.redop, &opts_, nullptr);
        break;
      case OpKind::kBroadcast:
        s = taiji_broadcast(peer_, name, recv_.get(), count, o_.dtype->dtype, o_.root, &opts_,
                            nullptr);
        break;
      case OpKind::kBarrier:
        s = taiji_barrier(peer_, name, &opts_, nullptr);
        break;
    }
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
  std::unique_ptr<unsigned char[]> send_;
  std::unique_ptr<unsigned char[]> recv_;
};

std::string shown_topology(const Options& o) {
  if (!o.topology.empty()) return o.topology;
  const char* env = std::getenv("TAIJI_TOPOLOGY");
  return env != nullptr && *env != '\0' ? env : "auto";
}

int run(const Options& o) {
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

  std::vector<Row> rows;
  bool all_ok = true;
  int code = 0;
  try {
    const std::vector<uint64_t> sizes = bench.sizes();
    bench.allocate(sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end()));
    if (rank == 0) print_header(info);
    for (uint64_t bytes : sizes) {
      Row row = bench.run_size(bytes);
      if (std::strcmp(row.check, "FAIL") == 0) all_ok = false;
      rows.push_back(row);
      if (rank == 0) print_row(info, row);
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
    print_footer(info, rows, all_ok);
    std::string error;
    if (!o.csv_path.empty() && !write_csv(o.csv_path, info, rows, &error)) {
      std::fprintf(stderr, "taiji-bench: %s\n", error.c_str());
      code = 2;
    }
    if (!o.json_path.empty() && !write_json(o.json_path, info, rows, all_ok, &error)) {
      std::fprintf(stderr, "taiji-bench: %s\n", error.c_str());
      code = 2;
    }
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
