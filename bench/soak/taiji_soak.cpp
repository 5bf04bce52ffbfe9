// taiji-soak: a long run of mixed allreduces (4 B .. 16 MiB, several names and dtypes,
// async and blocking, every result checked exactly) that watches the process's resident
// memory. Run by scripts/soak.sh under `taiji-run -np 4`; each peer prints one summary
// line, and the script turns them into a table and a verdict.
//
// Every peer posts the same ops in the same order (sizes and dtypes come from a generator
// seeded by the round), so the stop is agreed: after each round a MAX-allreduce of "my
// time is up" ends the run on all peers at the same round.
#include <taiji/taiji.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxBytes = size_t{16} << 20;
constexpr size_t kSizes[] = {4, 100, 4096, 65536, 65540, size_t{1} << 20, (size_t{4} << 20) + 4, kMaxBytes};
constexpr int kAsyncPerRound = 3;
constexpr int kNames = 5;
constexpr int64_t kOpTimeoutMs = 120000;

struct Kind {
  taiji_dtype_t dtype;
  taiji_reduce_op_t op;
  size_t elem;
  const char* name;
};
// Integer-valued inputs keep every sum exact, whatever order the peers combine in.
constexpr Kind kKinds[] = {{TAIJI_I32, TAIJI_SUM, 4, "i32-sum"},
                           {TAIJI_F32, TAIJI_SUM, 4, "f32-sum"},
                           {TAIJI_U8, TAIJI_MAX, 1, "u8-max"},
                           {TAIJI_F64, TAIJI_MIN, 8, "f64-min"},
                           {TAIJI_I64, TAIJI_SUM, 8, "i64-sum"}};

// VmRSS and VmHWM of this process, in KiB, from /proc/self/status.
struct Memory {
  long rss_kib = -1;
  long hwm_kib = -1;
};

Memory read_memory() {
  Memory m;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) m.rss_kib = std::atol(line.c_str() + 6);
    if (line.rfind("VmHWM:", 0) == 0) m.hwm_kib = std::atol(line.c_str() + 6);
  }
  return m;
}

uint64_t mix(uint64_t x) {  // splitmix64: the same sequence on every peer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Op {
  Kind kind;
  size_t count = 0;
  uint32_t seed = 0;
  std::string name;
};

class Soak {
 public:
  Soak(taiji_peer_t* peer, double seconds, double warmup)
      : peer_(peer), seconds_(seconds), warmup_(warmup), rank_(taiji_peer_rank(peer)),
        size_(taiji_peer_size(peer)) {
    for (auto& b : buffers_) b.resize(kMaxBytes);
  }

  int run() {
    auto start = Clock::now();
    for (uint64_t round = 0;; ++round) {
      if (!one_round(round)) break;
      double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      if (warm_.rss_kib < 0 && elapsed >= warmup_) warm_ = read_memory();
      if (rank_ == 0 && elapsed >= next_progress_) {
        std::printf("soak: %.0f s, %llu ops, %.1f GiB reduced per peer\n", elapsed,
                    static_cast<unsigned long long>(ops_), static_cast<double>(bytes_) / (1 << 30));
        std::fflush(stdout);
        next_progress_ += 60;
      }
      int32_t done = elapsed >= seconds_ ? 1 : 0;
      if (!call("soak/stop", taiji_allreduce(peer_, "soak/stop", &done, &done, 1, TAIJI_I32, TAIJI_MAX,
                                            &options_, nullptr))) {
        break;
      }
      if (done) break;
    }
    // The end sample, after the last op on every peer.
    if (failures_ == 0) call("soak/end", taiji_barrier(peer_, "soak/end", &options_, nullptr));
    Memory end = read_memory();
    if (warm_.rss_kib < 0) warm_ = end;
    int callbacks = callbacks_.load();
    if (failures_ == 0 && callbacks != async_ops_) {
      std::printf("FAIL rank=%d callbacks ran %d times for %d async ops\n", rank_, callbacks, async_ops_);
      ++failures_;
    }
    std::printf("soak-rss rank=%d pid=%ld warm_kib=%ld end_kib=%ld hwm_kib=%ld ops=%llu gib=%.1f failed=%d\n",
                rank_, static_cast<long>(getpid()), warm_.rss_kib, end.rss_kib, end.hwm_kib,
                static_cast<unsigned long long>(ops_), static_cast<double>(bytes_) / (1 << 30), failures_);
    std::fflush(stdout);
    return failures_;
  }

 private:
  // One round: kAsyncPerRound ops in flight at once, waited in reverse order, then one
  // blocking op. Returns false once anything failed.
  bool one_round(uint64_t round) {
    uint64_t g = mix(round);
    Op ops[kAsyncPerRound + 1];
    for (int k = 0; k <= kAsyncPerRound; ++k) {
      g = mix(g);
      const Kind& kind = kKinds[g % std::size(kKinds)];
      size_t bytes = kSizes[(g >> 8) % std::size(kSizes)];
      ops[k].kind = kind;
      ops[k].count = std::max<size_t>(1, bytes / kind.elem);
      ops[k].seed = static_cast<uint32_t>(g >> 32);
      ops[k].name = k < kAsyncPerRound ? "soak/" + std::to_string((g >> 16) % kNames) + "/" + kind.name
                                       : std::string("soak/step");
      fill(ops[k], buffers_[k].data());
    }
    taiji_request_t* reqs[kAsyncPerRound] = {};
    for (int k = 0; k < kAsyncPerRound; ++k) {
      taiji_op_options_t opt = options_;
      opt.callback = [](taiji_status_t status, void* user) {
        if (status == TAIJI_OK) static_cast<std::atomic<int>*>(user)->fetch_add(1);
      };
      opt.user_data = &callbacks_;
      void* buf = buffers_[k].data();
      if (!call(ops[k].name, taiji_allreduce(peer_, ops[k].name.c_str(), buf, buf, ops[k].count, ops[k].kind.dtype,
                                             ops[k].kind.op, &opt, &reqs[k]))) {
        reqs[k] = nullptr;
      } else {
        ++async_ops_;
      }
    }
    for (int k = kAsyncPerRound - 1; k >= 0; --k) {
      if (reqs[k] == nullptr) continue;
      if (call(ops[k].name, taiji_request_wait(reqs[k], -1))) check(ops[k], buffers_[k].data());
      taiji_request_free(reqs[k]);
    }
    Op& last = ops[kAsyncPerRound];
    void* buf = buffers_[kAsyncPerRound].data();
    if (failures_ == 0 && call(last.name, taiji_allreduce(peer_, last.name.c_str(), buf, buf, last.count,
                                                          last.kind.dtype, last.kind.op, &options_, nullptr))) {
      check(last, buf);
    }
    return failures_ == 0;
  }

  bool call(const std::string& what, taiji_status_t s) {
    if (s == TAIJI_OK) return true;
    std::printf("FAIL rank=%d op=%s status=%s text=%s\n", rank_, what.c_str(), taiji_status_name(s),
                taiji_peer_last_error(peer_));
    std::fflush(stdout);
    ++failures_;
    return false;
  }

  // Element j of rank r; the expected result follows from the same formula.
  static int64_t base(const Op& op, size_t j) { return static_cast<int64_t>((j + op.seed) % 1024); }

  void fill(const Op& op, void* buf) const {
    for (size_t j = 0; j < op.count; ++j) {
      int64_t v = base(op, j);
      switch (op.kind.dtype) {
        case TAIJI_I32: static_cast<int32_t*>(buf)[j] = static_cast<int32_t>((rank_ + 1) * v); break;
        case TAIJI_F32: static_cast<float*>(buf)[j] = static_cast<float>((rank_ + 1) * v); break;
        case TAIJI_U8: static_cast<uint8_t*>(buf)[j] = static_cast<uint8_t>((v + 37 * rank_) & 0xff); break;
        // The minimum's holder rotates with j: a result missing any rank shows.
        case TAIJI_F64: static_cast<double*>(buf)[j] = static_cast<double>(v) - 0.5 * static_cast<double>((rank_ + j) % static_cast<size_t>(size_)); break;
        default: static_cast<int64_t*>(buf)[j] = (rank_ + 1) * (v << 20); break;
      }
    }
  }

  void check(const Op& op, const void* buf) {
    ops_++;
    bytes_ += op.count * op.kind.elem;
    const int64_t ranks = int64_t{size_} * (size_ + 1) / 2;
    for (size_t j = 0; j < op.count; ++j) {
      int64_t v = base(op, j);
      bool good = true;
      switch (op.kind.dtype) {
        case TAIJI_I32: good = static_cast<const int32_t*>(buf)[j] == ranks * v; break;
        case TAIJI_F32: good = static_cast<const float*>(buf)[j] == static_cast<float>(ranks * v); break;
        case TAIJI_U8: {
          int64_t most = 0;
          for (int r = 0; r < size_; ++r) most = std::max<int64_t>(most, (v + 37 * r) & 0xff);
          good = static_cast<const uint8_t*>(buf)[j] == most;
          break;
        }
        case TAIJI_F64: good = static_cast<const double*>(buf)[j] == static_cast<double>(v) - 0.5 * (size_ - 1); break;
        default: good = static_cast<const int64_t*>(buf)[j] == ranks * (v << 20); break;
      }
      if (!good) {
        std::printf("FAIL rank=%d op=%s %s count=%zu: element %zu is wrong\n", rank_, op.name.c_str(),
                    op.kind.name, op.count, j);
        ++failures_;
        return;
      }
    }
  }

  taiji_peer_t* peer_;
  double seconds_;
  double warmup_;
  int rank_;
  int size_;
  taiji_op_options_t options_ = [] {
    taiji_op_options_t o = TAIJI_OP_OPTIONS_INIT;
    o.timeout_ms = kOpTimeoutMs;
    return o;
  }();
  std::vector<uint8_t> buffers_[kAsyncPerRound + 1];
  std::atomic<int> callbacks_{0};
  int async_ops_ = 0;
  int failures_ = 0;
  uint64_t ops_ = 0;
  uint64_t bytes_ = 0;
  double next_progress_ = 60;
  Memory warm_;
};

}  // namespace

int main(int argc, char** argv) {
  double seconds = 300, warmup = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--warmup") == 0 && i + 1 < argc) {
      warmup = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--seconds S (300)] [--warmup S (20, at most half the run)]\n", argv[0]);
      return 2;
    }
  }
  if (!(seconds > 0) || !(warmup > 0)) {
    std::fprintf(stderr, "--seconds and --warmup must be positive\n");
    return 2;
  }
  warmup = std::min(warmup, seconds / 2);
  taiji_peer_t* peer = nullptr;
  taiji_status_t s = taiji_peer_init(nullptr, &peer);
  if (s != TAIJI_OK) {
    std::fprintf(stderr, "init: %s: %s\n", taiji_status_name(s), taiji_peer_last_error(nullptr));
    return 1;
  }
  int failures = Soak(peer, seconds, warmup).run();
  s = taiji_peer_finalize(peer);
  if (s != TAIJI_OK) {
    std::printf("FAIL rank=%d finalize: %s: %s\n", taiji_peer_rank(peer), taiji_status_name(s),
                taiji_peer_last_error(peer));
    ++failures;
  }
  taiji_peer_destroy(peer);
  return failures == 0 ? 0 : 1;
}
