#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "bench.h"

namespace taiji_bench {
namespace {

// Inputs are small non-negative integers, so every partial result of any reduction order
// is exact as long as the final one stays within the type's exact limit; the check can
// then demand bitwise-equal results instead of a tolerance.
//
//   sum:     x = b*(rank+1) + m                  result = b*n(n+1)/2 + n*m
//   min/max: x = b*((rank+j)%n + 1) + m          result = b + m  /  b*n + m
//   prod:    x = 2 + j%3 on rank j%n, 2 on rank (j+1)%n, 1 elsewhere
//                                                result = 2*(2 + j%3)  (n = 1: 2 + j%3)
//   avg:     x = m + 1, plus n on rank j%n       result = m + 2
//
// Every rank holds the extreme of some elements (min/max), and two ranks differ from 1
// (prod), so a result that left out a rank, or took one rank's buffer, or the max for
// the product, fails the check.
// with j = element index + seed, m = j % k. b (0 or 1) and k (1..64) are the largest
// that keep the result within the limit, so tiny types and huge worlds degrade to
// fewer distinct values rather than to wrong expectations.
struct Plan {
  uint64_t b = 0;
  uint64_t k = 1;
  bool zero = false;  // no exact non-trivial pattern fits: every input is 0
};

Plan make_plan(uint64_t limit, taiji_reduce_op_t op, uint64_t n) {
  Plan p;
  switch (op) {
    case TAIJI_SUM: {
      uint64_t tri = n * (n + 1) / 2;
      p.b = tri <= limit ? 1 : 0;
      p.k = std::min<uint64_t>(64, (limit - p.b * tri) / n + 1);
      break;
    }
    case TAIJI_MIN:
    case TAIJI_MAX:
      p.b = n <= limit ? 1 : 0;
      p.k = std::min<uint64_t>(64, limit - p.b * n + 1);
      break;
    case TAIJI_PROD:
      break;
    case TAIJI_AVG:
      if (limit / n < 2) {
        p.zero = true;
      } else {
        p.k = std::min<uint64_t>(64, limit / n - 1);
      }
      break;
  }
  return p;
}

uint64_t input_value(const Plan& p, taiji_reduce_op_t op, uint64_t rank, uint64_t n,
                     uint64_t j) {
  if (p.zero) return 0;
  uint64_t m = j % p.k;
  switch (op) {
    case TAIJI_SUM:
    case TAIJI_MIN:
    case TAIJI_MAX: return p.b * ((rank + j) % n + 1) + m;
    case TAIJI_PROD: return rank == j % n ? 2 + j % 3 : n > 1 && rank == (j + 1) % n ? 2 : 1;
    case TAIJI_AVG: return m + 1 + (rank == j % n ? n : 0);
  }
  return 0;
}

uint64_t expected_value(const Plan& p, taiji_reduce_op_t op, uint64_t n, uint64_t j) {
  if (p.zero) return 0;
  uint64_t m = j % p.k;
  switch (op) {
    case TAIJI_SUM: return p.b * (n * (n + 1) / 2) + n * m;
    case TAIJI_MIN: return p.b + m;
    case TAIJI_MAX: return p.b * n + m;
    case TAIJI_PROD: return n > 1 ? 2 * (2 + j % 3) : 2 + j % 3;
    case TAIJI_AVG: return m + 2;
  }
  return 0;
}

// Encoders only ever see integers within the exact limit, so truncating the float's
// mantissa is exact; decoders handle every bit pattern, since results may be garbage.
struct F16 {
  uint16_t bits;
  static F16 encode(uint64_t v) {
    if (v == 0) return {0};
    uint32_t f = std::bit_cast<uint32_t>(static_cast<float>(v));
    int exp = static_cast<int>((f >> 23) & 0xff) - 127;
    return {static_cast<uint16_t>(((exp + 15) << 10) | ((f >> 13) & 0x3ff))};
  }
  double decode() const {
    int exp = (bits >> 10) & 0x1f;
    int mant = bits & 0x3ff;
    double mag;
    if (exp == 0) mag = std::ldexp(mant, -24);
    else if (exp == 31) mag = mant ? std::nan("") : INFINITY;
    else mag = std::ldexp(mant + 1024, exp - 25);
    return (bits & 0x8000) ? -mag : mag;
  }
};

struct BF16 {
  uint16_t bits;
  static BF16 encode(uint64_t v) {
    return {static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(v)) >> 16)};
  }
  double decode() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
};

template <typename T>
struct Codec {
  static T encode(uint64_t v) { return static_cast<T>(v); }
  static double decode(T x) { return static_cast<double>(x); }
};
template <>
struct Codec<F16> {
  static F16 encode(uint64_t v) { return F16::encode(v); }
  static double decode(F16 x) { return x.decode(); }
};
template <>
struct Codec<BF16> {
  static BF16 encode(uint64_t v) { return BF16::encode(v); }
  static double decode(BF16 x) { return x.decode(); }
};

template <typename F>
auto with_type(taiji_dtype_t dt, F&& f) {
  switch (dt) {
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

uint8_t pattern_byte(uint64_t seed, size_t i) {
  return static_cast<uint8_t>(i * 131 + 17 + seed * 29 + (i >> 8) * 7);
}

}  // namespace

void fill_allreduce_input(const DtypeInfo& dt, taiji_reduce_op_t op, int rank, int world,
                          uint64_t seed, void* buf, size_t count) {
  const uint64_t n = static_cast<uint64_t>(world);
  const uint64_t r = static_cast<uint64_t>(rank);
  const Plan plan = make_plan(dt.exact_limit, op, n);
  with_type(dt.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(buf);
    for (size_t i = 0; i < count; ++i) {
      out[i] = Codec<T>::encode(input_value(plan, op, r, n, i + seed));
    }
  });
}

bool verify_allreduce_output(const DtypeInfo& dt, taiji_reduce_op_t op, int world,
                             uint64_t seed, const void* buf, size_t count) {
  const uint64_t n = static_cast<uint64_t>(world);
  const Plan plan = make_plan(dt.exact_limit, op, n);
  return with_type(dt.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* in = static_cast<const T*>(buf);
    for (size_t i = 0; i < count; ++i) {
      double want = static_cast<double>(expected_value(plan, op, n, i + seed));
      if (!(Codec<T>::decode(in[i]) == want)) return false;
    }
    return true;
  });
}

void fill_broadcast_pattern(uint64_t seed, bool complement, void* buf, size_t bytes) {
  uint8_t* out = static_cast<uint8_t*>(buf);
  const uint8_t flip = complement ? 0xff : 0;
  for (size_t i = 0; i < bytes; ++i) out[i] = pattern_byte(seed, i) ^ flip;
}

bool verify_broadcast_pattern(uint64_t seed, const void* buf, size_t bytes) {
  const uint8_t* in = static_cast<const uint8_t*>(buf);
  for (size_t i = 0; i < bytes; ++i) {
    if (in[i] != pattern_byte(seed, i)) return false;
  }
  return true;
}

}  // namespace taiji_bench
