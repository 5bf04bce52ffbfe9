#include "common.h"

#include <thread>

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <type_traits>

namespace taiji_test {

// ---- failures -------------------------------------------------------------------------

void Failures::add(int rank, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  lines_.push_back("rank " + std::to_string(rank) + ": " + what);
}

void Failures::add_all(const std::vector<std::string>& lines) {
  std::lock_guard<std::mutex> lock(mu_);
  lines_.insert(lines_.end(), lines.begin(), lines.end());
}

bool Failures::expect_status(int rank, const std::string& what, taiji_status_t got,
                             taiji_status_t want) {
  if (got == want) return true;
  add(rank, what + ": got " + status_text(got) + ", expected " + status_text(want));
  return false;
}

bool Failures::expect(int rank, bool ok, const std::string& what) {
  if (!ok) add(rank, what);
  return ok;
}

std::vector<std::string> Failures::lines() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lines_;
}

size_t Failures::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lines_.size();
}

void check_no_failures(const Failures& failures) {
  // A broken runtime can fail thousands of ops the same way; the first lines say enough.
  constexpr size_t kShown = 25;
  auto lines = failures.lines();
  for (size_t i = 0; i < lines.size() && i < kShown; ++i) FAIL_CHECK(lines[i]);
  if (lines.size() > kShown) FAIL_CHECK("... and " << lines.size() - kShown << " more failures");
  CHECK(lines.empty());
}

std::string status_text(taiji_status_t s) {
  return std::string(taiji_status_name(s)) + " (" + std::to_string(static_cast<int>(s)) + ")";
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// ---- deterministic data -----------------------------------------------------------------

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t gen64(uint64_t salt, int rank, uint64_t index) {
  return mix64(salt ^ mix64((static_cast<uint64_t>(rank) << 44) ^ index));
}

uint64_t salt_of(const std::string& text) { return digest(text.data(), text.size()); }

uint64_t digest(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ull ^ bytes;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix64(h ^ w);
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return mix64(h);
}

void fill_bytes(uint64_t salt, void* data, size_t bytes) {
  auto* p = static_cast<uint8_t*>(data);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w = mix64(salt + i);
    std::memcpy(p + i, &w, 8);
  }
  uint64_t w = mix64(salt + i);
  for (; i < bytes; ++i) p[i] = static_cast<uint8_t>(w >> (8 * (i % 8)));
}

const taiji_dtype_t kAllDtypes[10] = {TAIJI_F32, TAIJI_F64, TAIJI_F16, TAIJI_BF16, TAIJI_I8,
                                      TAIJI_U8,  TAIJI_I32, TAIJI_U32, TAIJI_I64,  TAIJI_U64};
const taiji_reduce_op_t kAllOps[5] = {TAIJI_SUM, TAIJI_PROD, TAIJI_MIN, TAIJI_MAX, TAIJI_AVG};

const char* dtype_name(taiji_dtype_t dtype) {
  switch (dtype) {
    case TAIJI_F32: return "f32";
    case TAIJI_F64: return "f64";
    case TAIJI_F16: return "f16";
    case TAIJI_BF16: return "bf16";
    case TAIJI_I8: return "i8";
    case TAIJI_U8: return "u8";
    case TAIJI_I32: return "i32";
    case TAIJI_U32: return "u32";
    case TAIJI_I64: return "i64";
    case TAIJI_U64: return "u64";
  }
  return "dtype?";
}

const char* op_name(taiji_reduce_op_t op) {
  switch (op) {
    case TAIJI_SUM: return "sum";
    case TAIJI_PROD: return "prod";
    case TAIJI_MIN: return "min";
    case TAIJI_MAX: return "max";
    case TAIJI_AVG: return "avg";
  }
  return "op?";
}

size_t dtype_size(taiji_dtype_t dtype) {
  switch (dtype) {
    case TAIJI_I8:
    case TAIJI_U8: return 1;
    case TAIJI_F16:
    case TAIJI_BF16: return 2;
    case TAIJI_F32:
    case TAIJI_I32:
    case TAIJI_U32: return 4;
    case TAIJI_F64:
    case TAIJI_I64:
    case TAIJI_U64: return 8;
  }
  return 1;
}

// ---- half precision ---------------------------------------------------------------------

namespace {

double decode_small_float(uint32_t bits, int exp_bits, int mant_bits) {
  const uint32_t sign = bits >> (exp_bits + mant_bits);
  const uint32_t exp = (bits >> mant_bits) & ((1u << exp_bits) - 1);
  const uint32_t mant = bits & ((1u << mant_bits) - 1);
  const int bias = (1 << (exp_bits - 1)) - 1;
  double v;
  if (exp == (1u << exp_bits) - 1) {
    v = mant == 0 ? std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), 1 - bias - mant_bits);
  } else {
    v = std::ldexp(static_cast<double>(mant | (1u << mant_bits)), static_cast<int>(exp) - bias - mant_bits);
  }
  return sign ? -v : v;
}

// Rounds a finite double to the nearest value with `mant_bits` stored mantissa bits (ties to
// even); std::nearbyint rounds to nearest even in the default FP environment.
uint32_t encode_small_float(double value, int exp_bits, int mant_bits) {
  const uint32_t sign = std::signbit(value) ? 1u << (exp_bits + mant_bits) : 0u;
  const double a = std::fabs(value);
  const int bias = (1 << (exp_bits - 1)) - 1;
  const uint32_t inf = ((1u << exp_bits) - 1) << mant_bits;
  if (a == 0) return sign;
  int e2;
  std::frexp(a, &e2);
  int e = e2 - 1;  // a in [2^e, 2^(e+1))
  if (e < 1 - bias) {
    double q = std::nearbyint(std::ldexp(a, bias - 1 + mant_bits));
    return sign | static_cast<uint32_t>(q);  // q == 2^mant_bits is the smallest normal
  }
  double q = std::nearbyint(std::ldexp(a, mant_bits - e));
  if (q >= std::ldexp(1.0, mant_bits + 1)) {
    q /= 2;
    ++e;
  }
  if (e + bias >= (1 << exp_bits) - 1) return sign | inf;
  return sign | (static_cast<uint32_t>(e + bias) << mant_bits) |
         (static_cast<uint32_t>(q) - (1u << mant_bits));
}

}  // namespace

double f16_to_double(uint16_t bits) { return decode_small_float(bits, 5, 10); }
uint16_t f16_from_double(double value) {
  return static_cast<uint16_t>(encode_small_float(value, 5, 10));
}
double bf16_to_double(uint16_t bits) { return decode_small_float(bits, 8, 7); }
uint16_t bf16_from_double(double value) {
  return static_cast<uint16_t>(encode_small_float(value, 8, 7));
}

// ---- allreduce inputs and references ---------------------------------------------------

namespace {

struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

// Per storage type: conversion to and from double, unit roundoff, smallest subnormal, and
// a random finite value that is never -0 or NaN (MIN/MAX between +0 and -0 or with NaN
// depends on the reduction order, so neither can have a serial reference).
template <typename T>
struct FloatTraits;

template <>
struct FloatTraits<float> {
  static double to_d(float v) { return v; }
  static float from_d(double d) { return static_cast<float>(d); }
  static constexpr double unit = 0x1p-24;
  static constexpr double avg_rel = 1e-5;
  static constexpr double tiny = 0x1p-149;
  static float random(uint64_t m) {
    uint32_t b = static_cast<uint32_t>(m);
    if ((b & 0x7f800000u) == 0x7f800000u) b &= ~0x40000000u;
    if (b == 0x80000000u) b = 0;
    return std::bit_cast<float>(b);
  }
};

template <>
struct FloatTraits<double> {
  static double to_d(double v) { return v; }
  static double from_d(double d) { return d; }
  static constexpr double unit = 0x1p-53;
  static constexpr double avg_rel = 1e-12;
  static constexpr double tiny = 0x1p-1074;
  static double random(uint64_t m) {
    if ((m & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) m &= ~0x4000000000000000ull;
    if (m == 0x8000000000000000ull) m = 0;
    return std::bit_cast<double>(m);
  }
};

template <>
struct FloatTraits<F16> {
  static double to_d(F16 v) { return f16_to_double(v.bits); }
  static F16 from_d(double d) { return {f16_from_double(d)}; }
  static constexpr double unit = 0x1p-11;
  static constexpr double avg_rel = 2e-3;
  static constexpr double tiny = 0x1p-24;
  static F16 random(uint64_t m) {
    uint16_t b = static_cast<uint16_t>(m);
    if ((b & 0x7c00u) == 0x7c00u) b &= static_cast<uint16_t>(~0x4000u);
    if (b == 0x8000u) b = 0;
    return {b};
  }
};

template <>
struct FloatTraits<BF16> {
  static double to_d(BF16 v) { return bf16_to_double(v.bits); }
  static BF16 from_d(double d) { return {bf16_from_double(d)}; }
  static constexpr double unit = 0x1p-8;
  static constexpr double avg_rel = 1e-2;
  static constexpr double tiny = 0x1p-133;
  static BF16 random(uint64_t m) {
    uint16_t b = static_cast<uint16_t>(m);
    if ((b & 0x7f80u) == 0x7f80u) b &= static_cast<uint16_t>(~0x4000u);
    if (b == 0x8000u) b = 0;
    return {b};
  }
};

template <typename F>
decltype(auto) visit_dtype(taiji_dtype_t dtype, F&& f) {
  switch (dtype) {
    case TAIJI_F32: return f(float{});
    case TAIJI_F64: return f(double{});
    case TAIJI_F16: return f(F16{});
    case TAIJI_BF16: return f(BF16{});
    case TAIJI_I8: return f(int8_t{});
    case TAIJI_U8: return f(uint8_t{});
    case TAIJI_I32: return f(int32_t{});
    case TAIJI_U32: return f(uint32_t{});
    case TAIJI_I64: return f(int64_t{});
    case TAIJI_U64: return f(uint64_t{});
  }
  return f(uint8_t{});
}

double unit_fraction(uint64_t m) { return static_cast<double>(m >> 11) * 0x1p-53; }

template <typename T>
T value_of(const ReduceCase& c, int rank, uint64_t i) {
  const uint64_t m = gen64(c.salt, rank, i);
  if constexpr (std::is_integral_v<T>) {
    if (c.op == TAIJI_PROD) {
      // Mostly odd factors so products do not collapse to 0 modulo 2^bits, with some of
      // the small values (including -1) that make sign and wrap-around visible.
      static constexpr int64_t kSmall[4] = {1, 2, 3, -1};
      if ((m & 3) == 0) return static_cast<T>(kSmall[(m >> 2) & 3]);
      return static_cast<T>((m >> 8) | 1);
    }
    return static_cast<T>(m >> 8);
  } else {
    using Tr = FloatTraits<T>;
    if (c.op == TAIJI_MIN || c.op == TAIJI_MAX) return Tr::random(m >> 3);
    if (c.values == Values::Exact) {
      if (c.op == TAIJI_PROD) {
        static constexpr double kFactors[6] = {1, -1, 2, 0.5, -2, -0.5};
        return Tr::from_d(kFactors[(m >> 8) % 6]);
      }
      return Tr::from_d(static_cast<double>(static_cast<int>((m >> 8) % 33) - 16) * 0.25);
    }
    const double sign = (m & 1) ? -1.0 : 1.0;
    if (c.op == TAIJI_PROD) return Tr::from_d(sign * (0.5 + 1.5 * unit_fraction(m)));
    return Tr::from_d(8.0 * unit_fraction(m) - 4.0);
  }
}

template <typename T>
std::string format_value(T v) {
  std::ostringstream os;
  if constexpr (std::is_integral_v<T>) {
    os << static_cast<std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>(v);
  } else {
    os.precision(17);
    os << FloatTraits<T>::to_d(v);
  }
  return os.str();
}

template <typename T>
T integer_reference(const ReduceCase& c, int n, uint64_t i) {
  using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
  T first = value_of<T>(c, 0, i);
  U acc = static_cast<U>(first);
  T extreme = first;
  for (int r = 1; r < n; ++r) {
    T v = value_of<T>(c, r, i);
    switch (c.op) {
      case TAIJI_SUM:
      case TAIJI_AVG: acc = static_cast<U>(acc + static_cast<U>(v)); break;
      case TAIJI_PROD: acc = static_cast<U>(acc * static_cast<U>(v)); break;
      case TAIJI_MIN: extreme = std::min(extreme, v); break;
      case TAIJI_MAX: extreme = std::max(extreme, v); break;
    }
  }
  if (c.op == TAIJI_MIN || c.op == TAIJI_MAX) return extreme;
  T wrapped = static_cast<T>(acc);
  if (c.op != TAIJI_AVG) return wrapped;
  // The wrapped sum divided by n, truncating toward zero.
  if constexpr (std::is_signed_v<T>) {
    return static_cast<T>(static_cast<int64_t>(wrapped) / n);
  } else {
    return static_cast<T>(static_cast<uint64_t>(wrapped) / static_cast<uint64_t>(n));
  }
}

// Whether `got` is acceptable for element i, with a description of the expectation.
template <typename T>
bool float_matches(const ReduceCase& c, int n, uint64_t i, T got_v, std::string* expected) {
  using Tr = FloatTraits<T>;
  double sum = 0, abs_sum = 0, prod = 1;
  double lo = std::numeric_limits<double>::infinity();
  double hi = -lo;
  for (int r = 0; r < n; ++r) {
    double v = Tr::to_d(value_of<T>(c, r, i));
    sum += v;
    abs_sum += std::fabs(v);
    prod *= v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const double got = Tr::to_d(got_v);
  double want = 0;
  double bound = 0;
  // With Exact values the double sum and product are exact, so SUM and PROD must match
  // exactly; AVG then rounds once in the dtype. With Inexact values each of the n-1
  // reduction steps rounds at most one unit roundoff of a partial result, which is at
  // most the sum of magnitudes (sums) or, to first order, the final product.
  const double u = Tr::unit;
  switch (c.op) {
    case TAIJI_MIN: want = lo; break;
    case TAIJI_MAX: want = hi; break;
    case TAIJI_SUM:
      want = sum;
      if (c.values == Values::Inexact) bound = 1.05 * (n - 1) * u * abs_sum + n * Tr::tiny;
      break;
    case TAIJI_PROD:
      want = prod;
      if (c.values == Values::Inexact) bound = 1.05 * (n - 1) * u * std::fabs(prod) + n * Tr::tiny;
      break;
    case TAIJI_AVG:
      want = sum / n;
      if (c.values == Values::Inexact) {
        bound = 1.05 * u * abs_sum + n * Tr::tiny;
      } else {
        // One rounding of the quotient (two for the half types, through f32).
        bound = Tr::avg_rel * std::fabs(want);
      }
      break;
  }
  std::ostringstream os;
  os.precision(17);
  os << want;
  if (bound > 0) os << " +- " << bound;
  *expected = os.str();
  return std::fabs(got - want) <= bound;
}

}  // namespace

std::string describe(const ReduceCase& c) {
  return std::string(dtype_name(c.dtype)) + " " + op_name(c.op) + " count " +
         std::to_string(c.count) + (c.values == Values::Inexact ? " (inexact values)" : "");
}

void fill_input(const ReduceCase& c, int rank, void* buf) {
  visit_dtype(c.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(buf);
    for (size_t i = 0; i < c.count; ++i) p[i] = value_of<T>(c, rank, i);
  });
}

std::string check_reduce(const ReduceCase& c, int n, const void* out) {
  return visit_dtype(c.dtype, [&](auto tag) -> std::string {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(out);
    std::string report;
    size_t bad = 0;
    for (size_t i = 0; i < c.count; ++i) {
      std::string expected;
      bool ok;
      if constexpr (std::is_integral_v<T>) {
        T want = integer_reference<T>(c, n, i);
        ok = p[i] == want;
        if (!ok) expected = format_value(want);
      } else {
        ok = float_matches<T>(c, n, i, p[i], &expected);
      }
      if (!ok && ++bad <= 3) {
        report += " [" + std::to_string(i) + "] got " + format_value(p[i]) + " want " + expected;
      }
    }
    if (bad == 0) return {};
    return describe(c) + " over " + std::to_string(n) + " ranks: " + std::to_string(bad) +
           " wrong elements:" + report;
  });
}

// ---- requests and buffers ---------------------------------------------------------------

taiji_status_t wait_bounded(taiji_peer_t* peer, taiji_request_t* request, int64_t timeout_ms,
                            Failures& failures, int rank, const std::string& what) {
  taiji_status_t s = taiji_request_wait(request, timeout_ms);
  if (s != TAIJI_IN_PROGRESS) return s;
  failures.add(rank, what + ": still in progress after " + std::to_string(timeout_ms) +
                         " ms; aborting the peer");
  taiji_peer_abort(peer);
  s = taiji_request_wait(request, 10000);
  // Abort has closed every link by now, so even an op that never completes receives
  // nothing more into the caller's buffers.
  if (s == TAIJI_IN_PROGRESS) failures.add(rank, what + ": still in progress 10 s after abort");
  return s;
}

void wait_and_check(taiji_peer_t* peer, int rank, int n, const std::vector<ReduceCase>& cases,
                    std::vector<taiji_request_t*>& reqs, const std::vector<std::vector<uint8_t>>& out,
                    const std::string& prefix, const std::string& suffix, Failures& failures) {
  for (size_t k = 0; k < cases.size(); ++k) {
    const std::string name = prefix + std::to_string(k) + suffix;
    if (reqs[k] == nullptr) continue;
    taiji_status_t s = wait_bounded(peer, reqs[k], 40000, failures, rank, name);
    taiji_request_free(reqs[k]);
    reqs[k] = nullptr;
    if (!failures.expect_status(rank, name, s, TAIJI_OK)) continue;
    std::string err = check_reduce(cases[k], n, out[k].data());
    if (!err.empty()) failures.add(rank, name + ": " + err);
  }
}

taiji_op_options_t op_options(int64_t timeout_ms, const char* topology) {
  taiji_op_options_t o = TAIJI_OP_OPTIONS_INIT;
  o.timeout_ms = timeout_ms;
  o.topology = topology;
  return o;
}

EnvOverride::EnvOverride(const char* name, const char* value) : name_(name) {
  if (const char* old = std::getenv(name)) {
    had_ = true;
    old_ = old;
  }
  setenv(name, value, 1);
}

EnvOverride::~EnvOverride() {
  if (had_) {
    setenv(name_.c_str(), old_.c_str(), 1);
  } else {
    unsetenv(name_.c_str());
  }
}

GuardedBuffer::GuardedBuffer(size_t bytes, uint8_t fill) : bytes_(bytes), storage_(bytes + kGuard, fill) {
  for (size_t i = 0; i < kGuard; ++i) storage_[bytes + i] = static_cast<uint8_t>(0xA5 ^ i);
}

bool GuardedBuffer::guard_intact() const {
  for (size_t i = 0; i < kGuard; ++i) {
    if (storage_[bytes_ + i] != static_cast<uint8_t>(0xA5 ^ i)) return false;
  }
  return true;
}

void record_callback(taiji_status_t status, void* user_data) {
  auto* log = static_cast<CallbackLog*>(user_data);
  if (log->waiter.load() == std::this_thread::get_id()) log->on_waiter.fetch_add(1);
  log->status.store(status);
  log->calls.fetch_add(1);
}

bool await_calls(const CallbackLog& log, int want, std::chrono::milliseconds limit) {
  auto deadline = Clock::now() + limit;
  while (log.calls.load() < want && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return log.calls.load() == want;
}

size_t count_named(taiji_peer_t* peer, const std::string& name) {
  size_t needed = 0;
  taiji_flight_recorder_json(peer, nullptr, 0, &needed);
  std::string json(needed + 1, '\0');
  if (taiji_flight_recorder_json(peer, json.data(), json.size(), &needed) != TAIJI_OK) return 0;
  size_t found = 0;
  const std::string mark = "\"name\":\"" + name + "\"";
  for (size_t at = json.find(mark); at != std::string::npos; at = json.find(mark, at + 1)) ++found;
  return found;
}

bool quick() {
  const char* quick = std::getenv("TAIJI_TEST_QUICK");
  return quick != nullptr && *quick != 0 && std::string(quick) != "0";
}

bool in_quick_range(int n, int quick_max) {
  if (!quick()) return true;
  if (const char* cap = std::getenv("TAIJI_TEST_MAX_PEERS"); cap != nullptr && *cap != 0) {
    quick_max = std::min(quick_max, std::atoi(cap));
  }
  return n <= quick_max;
}

std::string metrics_json(taiji_peer_t* peer) {
  size_t needed = 0;
  taiji_metrics_json(peer, nullptr, 0, &needed);
  // Room for what changes between the two calls.
  std::string json(needed + 4096, '\0');
  if (taiji_metrics_json(peer, json.data(), json.size(), &needed) != TAIJI_OK) return {};
  json.resize(std::strlen(json.c_str()));
  return json;
}

uint64_t metric_value(taiji_peer_t* peer, const std::string& field, int link_peer) {
  const std::string json = metrics_json(peer);
  if (json.empty()) return UINT64_MAX;
  size_t from = 0;
  size_t to = json.size();
  if (link_peer >= 0) {
    // Link entries are flat objects: {"peer":R,...}.
    from = json.find("{\"peer\":" + std::to_string(link_peer) + ",");
    if (from == std::string::npos) return UINT64_MAX;
    to = json.find('}', from);
  }
  const std::string key = "\"" + field + "\":";
  const size_t at = json.find(key, from);
  if (at == std::string::npos || at > to) return UINT64_MAX;
  const char* digits = json.c_str() + at + key.size();
  if (*digits < '0' || *digits > '9') return UINT64_MAX;
  return std::strtoull(digits, nullptr, 10);
}

}  // namespace taiji_test

