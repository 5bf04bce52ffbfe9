// Shared by the comparison peers (taiji-compare-gloo, taiji-compare-mpi): flags, the data
// every result is checked against, timing and the JSON line each size prints.
//
// Every peer measures the same way: f32 data; `warmup` untimed ops; then `iters` ops back to
// back, each timed on its own; an iteration counts as long as it took on the slowest rank
// (the per-iteration maximum over ranks) and the row reports the median, like taiji-bench.
// CPU seconds are getrusage(RUSAGE_SELF) user+sys across the whole timed loop (all threads
// of the process), summed over ranks. After the loop the timed result is verified, then one
// more op with other data is run and verified, so a stale buffer cannot pass.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace compare {

enum class Op { kAllreduce, kBroadcast, kBarrier };

inline const char* op_name(Op op) {
  switch (op) {
    case Op::kAllreduce: return "allreduce";
    case Op::kBroadcast: return "broadcast";
    case Op::kBarrier: return "barrier";
  }
  return "?";
}

struct Options {
  Op op = Op::kAllreduce;
  uint64_t min_bytes = 4;
  uint64_t max_bytes = 64ull << 20;
  uint64_t factor = 2;
  // Iterations per size: ceil(iter_bytes / size) clamped to [min_iters, max_iters], so a
  // driver can give every implementation the same counts. --iters fixes them.
  uint64_t iter_bytes = 256ull << 20;
  int min_iters = 5;
  int max_iters = 200;
  int warmup = 2;
  std::string algos;  // implementation-specific list, empty = all
  std::string label;  // copied into every JSON line ("impl" field)
  // Gloo only: rendezvous directory, this rank's address, rank and world size.
  std::string store;
  std::string host = "127.0.0.1";
  int rank = -1;
  int world = -1;
};

inline bool parse_size(std::string_view s, uint64_t* out) {
  size_t digits = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
  if (digits == 0 || digits > 18) return false;
  uint64_t v = std::strtoull(std::string(s.substr(0, digits)).c_str(), nullptr, 10);
  std::string suffix;
  for (char c : s.substr(digits)) suffix += static_cast<char>(c | 0x20);
  unsigned shift = 0;
  if (suffix == "k" || suffix == "kib") shift = 10;
  else if (suffix == "m" || suffix == "mib") shift = 20;
  else if (suffix == "g" || suffix == "gib") shift = 30;
  else if (!suffix.empty() && suffix != "b") return false;
  *out = v << shift;
  return true;
}

inline void usage(const char* prog, const char* extra) {
  std::fprintf(stderr,
               "Usage: %s [options]\n"
               "  --op OP           allreduce (default), broadcast or barrier\n"
               "  -b N, -e N, -f F  sizes from N to N bytes (K/M/G suffixes), times F\n"
               "  --iters N         timed iterations per size (default: see --iter-bytes)\n"
               "  --iter-bytes B    iterations = ceil(B / size) within [--min-iters 5,\n"
               "                    --max-iters 200] (default 256M)\n"
               "  --warmup N        untimed iterations per size (default 2)\n"
               "  --label L         the \"impl\" field of the JSON lines\n"
               "%s"
               "Prints one JSON line per size (and algorithm) on rank 0; exit status 1 when a\n"
               "result is wrong, 2 on a usage or library error.\n",
               prog, extra);
}

// Returns false (after a message) on a bad flag. `extra` flags are handled by the caller
// through `other`, which returns false for an unknown one.
template <typename Other>
bool parse_options(int argc, char** argv, Options* o, Other other) {
  uint64_t fixed_iters = 0;
  for (int i = 1; i < argc; ++i) {
    std::string key = argv[i];
    if (key == "-h" || key == "--help") return false;
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", argv[0], key.c_str());
      return false;
    }
    std::string v = argv[++i];
    uint64_t n = 0;
    bool ok = true;
    if (key == "--op") {
      if (v == "allreduce") o->op = Op::kAllreduce;
      else if (v == "broadcast") o->op = Op::kBroadcast;
      else if (v == "barrier") o->op = Op::kBarrier;
      else ok = false;
    } else if (key == "-b" || key == "--min-bytes") {
      ok = parse_size(v, &o->min_bytes);
    } else if (key == "-e" || key == "--max-bytes") {
      ok = parse_size(v, &o->max_bytes);
    } else if (key == "-f" || key == "--step-factor") {
      ok = parse_size(v, &o->factor) && o->factor >= 2;
    } else if (key == "--iters" || key == "-n") {
      ok = parse_size(v, &fixed_iters) && fixed_iters >= 1 && fixed_iters <= 1000000;
    } else if (key == "--iter-bytes") {
      ok = parse_size(v, &o->iter_bytes);
    } else if (key == "--min-iters") {
      ok = parse_size(v, &n) && n >= 1 && n <= 1000000;
      o->min_iters = static_cast<int>(n);
    } else if (key == "--max-iters") {
      ok = parse_size(v, &n) && n >= 1 && n <= 1000000;
      o->max_iters = static_cast<int>(n);
    } else if (key == "--warmup" || key == "-w") {
      ok = parse_size(v, &n) && n <= 1000000;
      o->warmup = static_cast<int>(n);
    } else if (key == "--label") {
      o->label = v;
    } else if (!other(key, v)) {
      std::fprintf(stderr, "%s: unknown option %s\n", argv[0], key.c_str());
      return false;
    }
    if (!ok) {
      std::fprintf(stderr, "%s: bad value for %s: %s\n", argv[0], key.c_str(), v.c_str());
      return false;
    }
  }
  // --iters wins over the --iter-bytes rule wherever it stands.
  if (fixed_iters != 0) o->min_iters = o->max_iters = static_cast<int>(fixed_iters);
  if (o->min_bytes < 4) o->min_bytes = 4;
  if (o->max_bytes < o->min_bytes || o->min_iters > o->max_iters) {
    std::fprintf(stderr, "%s: empty size or iteration range\n", argv[0]);
    return false;
  }
  return true;
}

inline std::vector<uint64_t> sizes(const Options& o) {
  if (o.op == Op::kBarrier) return {0};
  std::vector<uint64_t> out;
  for (uint64_t b = o.min_bytes; b <= o.max_bytes; b *= o.factor) out.push_back(b / 4 * 4);
  return out;
}

inline int iterations(const Options& o, uint64_t bytes) {
  uint64_t want = bytes == 0 ? o.max_iters : (o.iter_bytes + bytes - 1) / bytes;
  return static_cast<int>(std::clamp<uint64_t>(want, o.min_iters, o.max_iters));
}

// Small integers, so every sum below is exact in f32 for any realistic world size.
inline float base_value(size_t i, int seed) {
  return static_cast<float>((i * 7 + static_cast<size_t>(seed) * 13) % 61);
}

// Allreduce input: rank r holds base + r + 1; the sum is n * base + n(n+1)/2.
inline void fill_allreduce(float* p, size_t count, int rank, int seed) {
  for (size_t i = 0; i < count; ++i) p[i] = base_value(i, seed) + static_cast<float>(rank + 1);
}
inline bool verify_allreduce(const float* p, size_t count, int world, int seed) {
  const float extra = static_cast<float>(world * (world + 1) / 2);
  for (size_t i = 0; i < count; ++i) {
    if (p[i] != static_cast<float>(world) * base_value(i, seed) + extra) return false;
  }
  return true;
}

// In-place allreduce input whose sum over ranks is zero (rank r holds (2r - n + 1) * v):
// ops run back to back on the same buffer and the values stay exact. The last timed op
// gets fill_allreduce inputs (untimed) so that its result is checked, and the extra
// checked op uses fill_allreduce with another seed.
inline void fill_zero_sum(float* p, size_t count, int rank, int world) {
  const float k = static_cast<float>(2 * rank - world + 1);
  for (size_t i = 0; i < count; ++i) p[i] = k * (base_value(i, 1) + 1);
}
inline bool verify_zero(const float* p, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (p[i] != 0.0f) return false;
  }
  return true;
}

// Broadcast: the root holds the pattern, everyone else -1 until the op overwrites it.
inline void fill_broadcast(float* p, size_t count, bool root, int seed) {
  for (size_t i = 0; i < count; ++i) p[i] = root ? base_value(i, seed) : -1.0f;
}
inline bool verify_broadcast(const float* p, size_t count, int seed) {
  for (size_t i = 0; i < count; ++i) {
    if (p[i] != base_value(i, seed)) return false;
  }
  return true;
}

inline double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// `times` are already the per-iteration maxima over ranks, `cpu` the sum over ranks.
inline void print_row(const Options& o, const char* impl, const char* algo, int world,
                      uint64_t bytes, int iters, const std::vector<double>& times, double cpu,
                      bool ok) {
  const double t = median(times);
  const double lo = *std::min_element(times.begin(), times.end());
  std::printf("{\"impl\": \"%s\", \"algo\": \"%s\", \"op\": \"%s\", \"dtype\": \"f32\", "
              "\"world_size\": %d, \"size_bytes\": %llu, \"iters\": %d, \"warmup\": %d, "
              "\"time_us\": %.3f, \"min_us\": %.3f, ",
              o.label.empty() ? impl : o.label.c_str(), algo, op_name(o.op), world,
              static_cast<unsigned long long>(bytes), iters, o.warmup, t * 1e6, lo * 1e6);
  if (o.op == Op::kBarrier) {
    std::printf("\"algbw_gbps\": null, \"busbw_gbps\": null, ");
  } else {
    const double algbw = static_cast<double>(bytes) / t / 1e9;
    const double factor = o.op == Op::kAllreduce ? 2.0 * (world - 1) / world : 1.0;
    std::printf("\"algbw_gbps\": %.6f, \"busbw_gbps\": %.6f, ", algbw, algbw * factor);
  }
  std::printf("\"cpu_s\": %.6f, \"cpu_s_per_op\": %.9f, \"check\": \"%s\"}\n", cpu,
              cpu / iters, o.op == Op::kBarrier ? "-" : (ok ? "ok" : "FAIL"));
  std::fflush(stdout);
}

}  // namespace compare
