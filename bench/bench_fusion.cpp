// taiji-bench --fusion-test: many small named allreduces posted at once and then all
// waited, the pattern of gradient buckets, with TAIJI_FUSION off and on. Both settings
// run in one process as two peers (the second under its own job id, on the first one's
// rendezvous store), batches alternating, so that both see the same machine load.
#include <taiji/taiji.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"

namespace taiji_bench {
namespace {

struct Failure {
  std::string what;
};

struct Side {
  bool fusion = false;
  taiji_peer_t* peer = nullptr;
  std::vector<double> times;  // per timed batch, this rank's
  bool pass = true;
};

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

void check(taiji_status_t s, taiji_peer_t* peer, const std::string& call) {
  if (s != TAIJI_OK) {
    throw Failure{call + ": " + taiji_status_name(s) + ": " + taiji_peer_last_error(peer)};
  }
}

// The setting is read from the environment at init, as an application would set it.
taiji_peer_t* open_peer(bool fusion, bool second) {
  setenv("TAIJI_FUSION", fusion ? "on" : "off", 1);
  taiji_config_t cfg = TAIJI_CONFIG_INIT;
  std::string job;
  if (second) {
    const char* base = std::getenv("TAIJI_JOB_ID");
    job = std::string(base != nullptr && *base != '\0' ? base : "taiji") + ".fusion";
    cfg.job_id = job.c_str();
    cfg.host_rendezvous = 0;  // the first peer's store (or the launcher's) serves both
  }
  taiji_peer_t* peer = nullptr;
  taiji_status_t s = taiji_peer_init(&cfg, &peer);
  if (s != TAIJI_OK) {
    throw Failure{std::string("taiji_peer_init (fusion ") + (fusion ? "on" : "off") +
                  "): " + taiji_status_name(s) + ": " + taiji_peer_last_error(nullptr)};
  }
  return peer;
}

class FusionTest {
 public:
  explicit FusionTest(const Options& o)
      : o_(o),
        n_(static_cast<size_t>(o.fusion_ops)),
        count_(static_cast<size_t>(o.fusion_op_bytes / o.dtype->size)),
        send_(n_ * count_ * o.dtype->size),
        recv_(n_ * count_ * o.dtype->size) {
    opts_.timeout_ms = o.timeout_ms;
    for (size_t i = 0; i < n_; ++i) names_.push_back("bench.fuse." + std::to_string(i));
  }

  // One batch: post every op, wait for all; returns this rank's seconds. Inputs and
  // checks stay outside the timed region.
  double batch(Side& side, uint64_t seed, int rank, int world) {
    const size_t bytes = count_ * o_.dtype->size;
    for (size_t i = 0; i < n_; ++i) {
      fill_allreduce_input(*o_.dtype, o_.redop, rank, world, seed + i, &send_[i * bytes], count_);
    }
    std::fill(recv_.begin(), recv_.end(), uint8_t{0xff});
    // The other peer in this process polls for a while after its own batch (adaptive
    // progress, up to TAIJI_SPIN_US): let it go idle first, as an application's only peer
    // would be, so that neither side's batch shares its cores with the other's leftovers.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    check(taiji_barrier(side.peer, "bench.fuse.sync", &opts_, nullptr), side.peer, "taiji_barrier");
    std::vector<taiji_request_t*> reqs(n_, nullptr);
    auto start = std::chrono::steady_clock::now();
    if (o_.fusion_group) check(taiji_group_start(side.peer), side.peer, "taiji_group_start");
    for (size_t i = 0; i < n_; ++i) {
      check(taiji_allreduce(side.peer, names_[i].c_str(), &send_[i * bytes], &recv_[i * bytes],
                            count_, o_.dtype->dtype, o_.redop, &opts_, &reqs[i]),
            side.peer, "taiji_allreduce(" + names_[i] + ")");
    }
    if (o_.fusion_group) check(taiji_group_end(side.peer), side.peer, "taiji_group_end");
    taiji_status_t first = TAIJI_OK;
    for (taiji_request_t* r : reqs) {
      taiji_status_t s = taiji_request_wait(r, -1);
      if (first == TAIJI_OK) first = s;
      taiji_request_free(r);
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    check(first, side.peer, "taiji_request_wait");
    // No rank checks while another is still timed: the checks would share its cores.
    check(taiji_barrier(side.peer, "bench.fuse.done", &opts_, nullptr), side.peer, "taiji_barrier");
    for (size_t i = 0; i < n_; ++i) {
      if (!verify_allreduce_output(*o_.dtype, o_.redop, world, seed + i, &recv_[i * bytes], count_)) {
        side.pass = false;
      }
    }
    return seconds;
  }

  size_t count() const { return count_; }

 private:
  const Options& o_;
  size_t n_;
  size_t count_;
  std::vector<uint8_t> send_;
  std::vector<uint8_t> recv_;
  std::vector<std::string> names_;
  taiji_op_options_t opts_ = TAIJI_OP_OPTIONS_INIT;
};

void print_side(const Options& o, const Side& side, size_t ops) {
  double med = median_of(side.times) * 1e6;
  double lo = *std::min_element(side.times.begin(), side.times.end()) * 1e6;
  double hi = *std::max_element(side.times.begin(), side.times.end()) * 1e6;
  std::printf("  %-6s %12.1f %12.1f %12.1f %12.2f  %s\n", side.fusion ? "on" : "off", med, lo, hi,
              med / static_cast<double>(ops), side.pass ? "ok" : "FAIL");
  (void)o;
}

}  // namespace

int run_fusion_test(const Options& o) {
  const int iters = o.iters.value_or(20);
  const int warmup = o.warmup.value_or(3);
  std::vector<Side> sides;
  for (bool fusion : {false, true}) {
    if (o.fusion == (fusion ? FusionMode::kOff : FusionMode::kOn)) continue;
    Side side;
    side.fusion = fusion;
    sides.push_back(side);
  }
  int rank = 0;
  int world = 1;
  int code = 0;
  try {
    for (size_t i = 0; i < sides.size(); ++i) sides[i].peer = open_peer(sides[i].fusion, i > 0);
    rank = taiji_peer_rank(sides[0].peer);
    world = taiji_peer_size(sides[0].peer);
    FusionTest test(o);
    uint64_t seed = 1;
    for (int b = 0; b < warmup + iters; ++b) {
      for (Side& side : sides) {
        double t = test.batch(side, seed, rank, world);
        seed += static_cast<uint64_t>(o.fusion_ops);
        if (b >= warmup) side.times.push_back(t);
      }
    }
    // Each batch counts as long as its slowest rank took.
    for (Side& side : sides) {
      check(taiji_allreduce(side.peer, "bench.fuse.times", side.times.data(), side.times.data(),
                            side.times.size(), TAIJI_F64, TAIJI_MAX, nullptr, nullptr),
            side.peer, "taiji_allreduce(bench.fuse.times)");
      int pass = side.pass ? 1 : 0;
      check(taiji_allreduce(side.peer, "bench.fuse.pass", &pass, &pass, 1, TAIJI_I32, TAIJI_MIN,
                            nullptr, nullptr),
            side.peer, "taiji_allreduce(bench.fuse.pass)");
      side.pass = pass == 1;
    }
    for (Side& side : sides) check(taiji_peer_finalize(side.peer), side.peer, "taiji_peer_finalize");
    if (rank == 0) {
      std::printf("# taiji-bench fusion test: %d x %s allreduce (%s %s) per batch, %s, %d peers, "
                  "%d batches (+%d warmup)\n",
                  o.fusion_ops, format_bytes(o.fusion_op_bytes).c_str(), o.dtype->name,
                  redop_name(o.redop), o.fusion_group ? "posted in one group" : "posted one by one",
                  world, iters, warmup);
      std::printf("# %-6s %12s %12s %12s %12s  %s\n", "fusion", "median(us)", "min(us)", "max(us)",
                  "per-op(us)", "check");
      for (const Side& side : sides) print_side(o, side, static_cast<size_t>(o.fusion_ops));
      if (sides.size() == 2) {
        std::printf("# speed-up with fusion (off median / on median): %.2fx\n",
                    median_of(sides[0].times) / median_of(sides[1].times));
      }
    }
    for (const Side& side : sides) {
      if (!side.pass) code = 1;
    }
  } catch (const Failure& f) {
    std::fprintf(stderr, "taiji-bench: rank %d: %s\n", rank, f.what.c_str());
    for (Side& side : sides) {
      if (side.peer != nullptr) taiji_peer_abort(side.peer);
    }
    code = 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "taiji-bench: rank %d: out of memory for %d x %s buffers\n", rank, o.fusion_ops,
                 format_bytes(o.fusion_op_bytes).c_str());
    for (Side& side : sides) {
      if (side.peer != nullptr) taiji_peer_abort(side.peer);
    }
    code = 2;
  }
  for (Side& side : sides) taiji_peer_destroy(side.peer);
  return code;
}

}  // namespace taiji_bench
