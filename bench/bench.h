// Pieces of taiji-bench shared between its translation units. Only the public C API of
// the library is used, so the benchmark measures exactly what applications see.
#ifndef TAIJI_BENCH_BENCH_H
#define TAIJI_BENCH_BENCH_H

#include <taiji/taiji.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace taiji_bench {

enum class OpKind { kAllreduce, kBroadcast, kBarrier };

// --metrics: the library's op metrics on, off, or both (interleaved iterations, compared).
enum class MetricsMode { kDefault, kOn, kOff, kBoth };

// --fusion: the fusion test's peers (TAIJI_FUSION off, on, or both, alternating).
enum class FusionMode { kOn, kOff, kBoth };

struct DtypeInfo {
  taiji_dtype_t dtype;
  const char* name;
  size_t size;
  // Largest integer L such that every integer in 0..L is exact in the type; test inputs
  // and results stay within it so the expected values are exact whatever the
  // reduction order.
  uint64_t exact_limit;
};

struct Options {
  OpKind op = OpKind::kAllreduce;
  uint64_t min_bytes = 4;
  uint64_t max_bytes = 64ull << 20;
  uint64_t step_factor = 2;
  const DtypeInfo* dtype = nullptr;  // set by parse_options
  taiji_reduce_op_t redop = TAIJI_SUM;
  std::optional<int> iters;   // unset: chosen per size from the measured warmup
  std::optional<int> warmup;  // unset: depends on the size
  std::string topology;       // empty: the peer's choice
  // Non-empty: sweep mode, the same size sweep once per strategy, one table at the end.
  std::vector<std::string> sweep_topologies;
  // Swap mode: one size (max_bytes), `iters` iterations, a run-time topology swap to
  // swap_to before iteration swap_at, and a per-iteration timeline.
  std::optional<int> swap_at;
  std::string swap_to;
  int root = 0;
  std::string csv_path;
  std::string json_path;
  int64_t timeout_ms = 120000;
  bool check = true;
  MetricsMode metrics = MetricsMode::kDefault;
  // --fusion-test NxSIZE: N allreduces of SIZE bytes posted together, then all waited;
  // 0: not a fusion test.
  int fusion_ops = 0;
  uint64_t fusion_op_bytes = 0;
  FusionMode fusion = FusionMode::kBoth;
  // --group: each batch posted inside taiji_group_start/end.
  bool fusion_group = false;
};

// Outcome of parse_options: run, exit 0 after --help, or exit 2 after a usage error.
enum class ParseResult { kRun, kHelp, kError };

ParseResult parse_options(int argc, char** argv, Options* out, std::string* error);
void print_usage();

// The library's built-in topology names, in its order (taiji.h lists them).
const std::vector<std::string_view>& builtin_topologies();
// Iterations of a swap run when --iters is not given.
constexpr int kDefaultSwapIters = 20;

const char* op_name(OpKind op);
const char* redop_name(taiji_reduce_op_t op);
std::string format_bytes(uint64_t bytes);  // "64 MiB", "4 B", "1.5 KiB"

// The fusion test (bench_fusion.cpp): prints its own table; returns the exit status.
int run_fusion_test(const Options& o);

// ---- test data (bench_data.cpp) ------------------------------------------------------

// Fills an allreduce input whose reduction over `world` peers is exactly known, for
// element type `dt` and operator `op`; `seed` varies the values between uses.
void fill_allreduce_input(const DtypeInfo& dt, taiji_reduce_op_t op, int rank, int world,
                          uint64_t seed, void* buf, size_t count);
// True if every element of `buf` equals the reduction fill_allreduce_input implies.
bool verify_allreduce_output(const DtypeInfo& dt, taiji_reduce_op_t op, int world,
                             uint64_t seed, const void* buf, size_t count);

// Broadcast data is compared bytewise, so any pattern works; non-roots start from the
// complement so that a broadcast that delivered nothing cannot pass.
void fill_broadcast_pattern(uint64_t seed, bool complement, void* buf, size_t bytes);
bool verify_broadcast_pattern(uint64_t seed, const void* buf, size_t bytes);

// ---- results (bench_report.cpp) ------------------------------------------------------

struct Row {
  uint64_t bytes = 0;
  size_t count = 0;
  int iters = 0;
  int warmup = 0;
  double time_us = 0;  // median over iterations of the slowest peer's time
  double min_us = 0;   // fastest and slowest iteration, same per-iteration maximum
  double max_us = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  bool has_bandwidth = true;
  const char* check = "-";  // "ok", "FAIL", or "-" when not checked
  std::string topology;     // set in sweep mode: the strategy the row ran on
  // --metrics both: medians of the iterations run with metrics off and on.
  bool compared = false;
  double off_us = 0;
  double on_us = 0;
};

// One timed iteration of a swap run.
struct Sample {
  int iter = 0;
  double time_us = 0;  // the slowest peer's time
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  uint64_t digest = 0;   // taiji_request_topology_digest of rank 0's op
  std::string topology;  // the built-in name with that digest, or "?"
  const char* check = "-";
};

struct SwapResult {
  uint64_t bytes = 0;
  size_t count = 0;
  int warmup = 0;
  int swap_at = 0;
  std::string from;  // the starting topology as shown ("auto" if the peer's choice)
  std::string to;
  double swap_us = 0;  // the slowest peer's taiji_set_topology call, posting to completion
  uint64_t swap_digest = 0;  // taiji_request_topology_digest of the swap request
  uint64_t to_digest = 0;    // taiji_topology_digest of `to` as built for this job
  std::vector<Sample> samples;
};

struct RunInfo {
  const Options* options = nullptr;
  int world = 1;
  std::string topology;  // as shown: the requested one, or "auto"
  std::string version;
};

void print_header(const RunInfo& info);
void print_row(const RunInfo& info, const Row& row);
void print_footer(const RunInfo& info, const std::vector<Row>& rows, bool all_ok);
// --metrics both: per size, the time and busbw with metrics off and on, and the change.
void print_metrics_comparison(const RunInfo& info, const std::vector<Row>& rows);
// Sweep mode: one line per size, one column per strategy (busbw, or time without
// bandwidth), and the winner of each size. rows[i] holds strategy names[i]'s sweep and
// digests[i] its taiji_topology_digest in this job (0: unknown), which tells strategies
// that run on the same graphs here apart from different ones.
void print_sweep_table(const RunInfo& info, const std::vector<std::string>& names,
                       const std::vector<uint64_t>& digests,
                       const std::vector<std::vector<Row>>& rows, bool all_ok);
void print_timeline(const RunInfo& info, const SwapResult& swap, bool all_ok);
bool write_timeline_csv(const std::string& path, const RunInfo& info, const SwapResult& swap,
                        std::string* error);
bool write_timeline_json(const std::string& path, const RunInfo& info, const SwapResult& swap,
                         bool all_ok, std::string* error);
// Both return false with *error set if the file cannot be written.
bool write_csv(const std::string& path, const RunInfo& info, const std::vector<Row>& rows,
               std::string* error);
bool write_json(const std::string& path, const RunInfo& info, const std::vector<Row>& rows,
                bool all_ok, std::string* error);

}  // namespace taiji_bench

#endif  // TAIJI_BENCH_BENCH_H
