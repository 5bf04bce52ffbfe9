// What gradient statistics cost: a plain allreduce and the same allreduce with statistics
// attached, interleaved iteration by iteration (plain, monitored, plain, ...) so both see
// the same machine, at each size; medians of the slowest peer's time and their ratio.
//
//   taiji-run -np 4 taiji-bench-gradstats [--bytes 16M] [--iters 40] [--warmup 5] [--variance]
//
// Every result is checked (the sum of known inputs) and the statistics must be defined at
// the end; exits non-zero otherwise.
#include <taiji/taiji.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Options {
  size_t bytes = 16u << 20;
  int iters = 40;
  int warmup = 5;
  bool variance = false;
};

// A whole number with an optional K or M suffix; 0 for anything else (refused by parse).
size_t parse_bytes(const char* s) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || errno != 0 || *s == '-') return 0;
  const unsigned long long scale = *end == 'K' ? 1024ull : *end == 'M' ? 1024ull * 1024 : 1;
  if (scale != 1) ++end;
  if (*end != '\0' || v > (1ull << 40) / scale) return 0;
  return static_cast<size_t>(v * scale);
}

// A whole number in [min, max]; -1 for anything else.
int parse_count(const char* s, int min, int max) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || errno != 0 || v < min || v > max) return -1;
  return static_cast<int>(v);
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--bytes" && (v = next())) o->bytes = parse_bytes(v);
    else if (a == "--iters" && (v = next())) o->iters = parse_count(v, 1, 1000000);
    else if (a == "--warmup" && (v = next())) o->warmup = parse_count(v, 0, 1000000);
    else if (a == "--variance") o->variance = true;
    else return false;
  }
  return o->bytes >= 4 && o->iters > 0 && o->warmup >= 0;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

// The slowest peer's time: an allreduce MAX of each peer's own.
double slowest(taiji_peer_t* peer, double seconds) {
  taiji_allreduce(peer, "gradstats-bench/time", &seconds, &seconds, 1, TAIJI_F64, TAIJI_MAX, nullptr, nullptr);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) {
    std::fprintf(stderr, "usage: taiji-bench-gradstats [--bytes N[K|M]] [--iters N] [--warmup N] [--variance]\n");
    return 2;
  }
  taiji_peer_t* peer = nullptr;
  taiji_status_t s = taiji_peer_init(nullptr, &peer);
  if (s != TAIJI_OK) {
    std::fprintf(stderr, "init: %s: %s\n", taiji_status_name(s), taiji_peer_last_error(nullptr));
    return 1;
  }
  const int rank = taiji_peer_rank(peer), n = taiji_peer_size(peer);
  taiji_grad_stats_config_t cfg = TAIJI_GRAD_STATS_CONFIG_INIT;
  cfg.batch_size = 32;
  cfg.element_variance = o.variance ? 1 : 0;
  cfg.tensors_per_step = 1;
  taiji_grad_stats_t* stats = nullptr;
  if (taiji_grad_stats_create(peer, &cfg, &stats) != TAIJI_OK) {
    std::fprintf(stderr, "grad stats: %s\n", taiji_peer_last_error(peer));
    return 1;
  }
  const size_t count = o.bytes / sizeof(float);
  std::vector<float> buf(count);
  int bad = 0;
  std::vector<double> plain, monitored;
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    for (int mode = 0; mode < 2; ++mode) {
      // Small integers: the sum is exact. Ranks differ, so the variance is not zero.
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>((i % 7) + rank);
      taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
      opt.grad_stats = mode == 1 ? stats : nullptr;
      const char* name = mode == 1 ? "gradstats-bench/monitored" : "gradstats-bench/plain";
      auto t0 = std::chrono::steady_clock::now();
      s = taiji_allreduce(peer, name, buf.data(), buf.data(), count, TAIJI_F32, TAIJI_SUM, &opt, nullptr);
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s != TAIJI_OK) {
        std::fprintf(stderr, "allreduce: %s: %s\n", taiji_status_name(s), taiji_peer_last_error(peer));
        return 1;
      }
      for (size_t i = 0; i < count && bad < 5; ++i) {
        const float want = static_cast<float>(n * static_cast<int>(i % 7) + n * (n - 1) / 2);
        if (buf[i] != want) {
          std::fprintf(stderr, "element %zu is %g, expected %g\n", i, buf[i], want);
          bad++;
        }
      }
      t = slowest(peer, t);
      if (it >= o.warmup) (mode == 1 ? monitored : plain).push_back(t);
    }
  }
  taiji_grad_stats_result_t r = TAIJI_GRAD_STATS_RESULT_INIT;
  taiji_grad_stats_read(stats, &r);
  if (n > 1 && r.state != TAIJI_GRAD_STATS_DEFINED) {
    std::fprintf(stderr, "statistics: %s\n", taiji_grad_stats_state_string(r.state));
    bad++;
  }
  if (rank == 0) {
    const double p = median(plain), m = median(monitored);
    std::printf("# %d peers, f32 sum, %d iterations after %d warm-up, interleaved%s\n", n, o.iters, o.warmup,
                o.variance ? ", with element variance" : "");
    std::printf("%12s %14s %14s %8s %12s\n", "size(B)", "plain(us)", "stats(us)", "ratio", "noise scale");
    std::printf("%12zu %14.1f %14.1f %8.3f %12.4g\n", count * sizeof(float), p * 1e6, m * 1e6, m / p,
                r.noise_scale);
  }
  taiji_grad_stats_destroy(stats);
  taiji_peer_finalize(peer);
  taiji_peer_destroy(peer);
  return bad == 0 ? 0 : 1;
}
