// Shared pieces of the multi-peer tests: a failure log that peer threads can write to
// (Catch2 assertions are only safe on the test's own thread), deterministic inputs,
// serial references for allreduce, and bounded waiting.
#pragma once

#include <taiji/taiji.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace taiji_test {

class Failures {
 public:
  void add(int rank, const std::string& what);
  void add_all(const std::vector<std::string>& lines);
  // Records a failure unless got == want; returns whether it matched.
  bool expect_status(int rank, const std::string& what, taiji_status_t got, taiji_status_t want);
  bool expect(int rank, bool ok, const std::string& what);
  std::vector<std::string> lines() const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

// Reports every recorded line through Catch2 as a non-fatal failure (the first few in full).
// Call on the test thread only.
void check_no_failures(const Failures& failures);

std::string status_text(taiji_status_t s);

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point start);

// Deterministic pseudo-random stream keyed by (salt, rank, index).
uint64_t mix64(uint64_t x);
uint64_t gen64(uint64_t salt, int rank, uint64_t index);
uint64_t salt_of(const std::string& text);
// 64-bit digest of a byte range, for comparing outputs across ranks.
uint64_t digest(const void* data, size_t bytes);
// Fills a buffer with bytes derived from salt (broadcast payloads).
void fill_bytes(uint64_t salt, void* data, size_t bytes);

extern const taiji_dtype_t kAllDtypes[10];
extern const taiji_reduce_op_t kAllOps[5];
const char* dtype_name(taiji_dtype_t dtype);
const char* op_name(taiji_reduce_op_t op);
size_t dtype_size(taiji_dtype_t dtype);

// Reference half-precision conversions, written independently of the runtime's.
double f16_to_double(uint16_t bits);
uint16_t f16_from_double(double value);  // round to nearest even; finite in-range values
double bf16_to_double(uint16_t bits);
uint16_t bf16_from_double(double value);

// How allreduce inputs are chosen. Exact: every partial result of SUM/PROD is exactly
// representable in the dtype (small multiples of 1/4, signed powers of two), so any
// reduction order gives the serial result and only AVG's final division rounds.
// Inexact: arbitrary values, checked against a rounding-error bound.
enum class Values { Exact, Inexact };

struct ReduceCase {
  taiji_dtype_t dtype = TAIJI_F32;
  taiji_reduce_op_t op = TAIJI_SUM;
  size_t count = 0;
  uint64_t salt = 0;
  Values values = Values::Exact;
};

std::string describe(const ReduceCase& c);
// Writes rank's input (count elements) into buf.
void fill_input(const ReduceCase& c, int rank, void* buf);
// Compares out (count elements) with the serial reference over n ranks. Returns an empty
// string on success, else the first differences.
std::string check_reduce(const ReduceCase& c, int n, const void* out);

// Waits for a request; if it is still running after timeout_ms, records a failure and
// aborts the peer so that the op lets go of the caller's buffers before they go away.
taiji_status_t wait_bounded(taiji_peer_t* peer, taiji_request_t* request, int64_t timeout_ms,
                            Failures& failures, int rank, const std::string& what);

// Waits for every posted request (bounded), frees it, and checks out[k] against the serial
// reference of cases[k] over n ranks; failures name op k as prefix + k + suffix.
void wait_and_check(taiji_peer_t* peer, int rank, int n, const std::vector<ReduceCase>& cases,
                    std::vector<taiji_request_t*>& reqs, const std::vector<std::vector<uint8_t>>& out,
                    const std::string& prefix, const std::string& suffix, Failures& failures);
// The peer's metrics JSON (taiji_metrics_json); empty when the snapshot fails.
std::string metrics_json(taiji_peer_t* peer);

// A whole-number field of the peer's metrics JSON (taiji_metrics_json): top-level, or in
// the "links" entry for rank link_peer when that is >= 0. UINT64_MAX when it is missing.
uint64_t metric_value(taiji_peer_t* peer, const std::string& field, int link_peer = -1);

// Options with a deadline, so a hang becomes a failure rather than a stuck test.
taiji_op_options_t op_options(int64_t timeout_ms = 20000, const char* topology = nullptr);

// How many flight recorder entries carry exactly this op name (an entry appears when the
// op starts).
size_t count_named(taiji_peer_t* peer, const std::string& name);

// TAIJI_TEST_QUICK set (and not 0): the sweeps over world sizes stop at `quick_max` peers,
// or at TAIJI_TEST_MAX_PEERS if that is lower. The sanitizer passes set them: they run
// 3-10x slower, and the races and memory errors they look for do not depend on how many of
// the larger sizes run (the plain pass runs them).
bool in_quick_range(int n, int quick_max = 4);
// Whether TAIJI_TEST_QUICK is set (and not 0).
bool quick();

// A byte buffer with a guard zone after `bytes` whose pattern must survive every op.
// Sets an environment variable for the guard's lifetime, then restores the previous value
// or its absence. The environment is process-wide and peers read it in taiji_peer_init, so
// use it on the test thread around run_peers, never while other peers are starting.
class EnvOverride {
 public:
  EnvOverride(const char* name, const char* value);
  ~EnvOverride();
  EnvOverride(const EnvOverride&) = delete;
  EnvOverride& operator=(const EnvOverride&) = delete;

 private:
  std::string name_;
  bool had_ = false;
  std::string old_;
};

class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t bytes, uint8_t fill = 0xCD);
  uint8_t* data() { return storage_.data(); }
  size_t size() const { return bytes_; }
  bool guard_intact() const;

 private:
  static constexpr size_t kGuard = 64;
  size_t bytes_;
  std::vector<uint8_t> storage_;
};

// Counts completion callbacks: pass &log as user_data with record_callback.
struct CallbackLog {
  std::atomic<int> calls{0};
  std::atomic<int> status{1000};
  // Set before the post: counts calls made on this thread (a waiter running the loop must
  // leave user callbacks to the I/O thread).
  std::atomic<std::thread::id> waiter{};
  std::atomic<int> on_waiter{0};
};
// The status is stored before the count, and the count is the callback's last touch of the
// log, so a waiter that sees the count may read the status and then free the log.
void record_callback(taiji_status_t status, void* user_data);
// Callbacks run on the I/O thread and may lag the waiter by a moment: gives them a bounded
// time to arrive, then a little longer to catch a second call.
bool await_calls(const CallbackLog& log, int want, std::chrono::milliseconds limit);

}  // namespace taiji_test
