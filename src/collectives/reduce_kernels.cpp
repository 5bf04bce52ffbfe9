#include "collectives/reduce_kernels.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>

namespace taiji {
namespace {

// ---------------------------------------------------------------------------------------
// Half-precision conversions. Bit manipulation plus a few float operations that are all
// exact (scaling by powers of two, small int <-> float), so the result never depends on
// the FP environment: a caller that changed the rounding mode or enabled FTZ/DAZ still
// gets IEEE round-to-nearest-even. Every case is computed and the answer picked with
// masks rather than branches: GCC will not if-convert a branch holding a float operation
// (it may trap), and any control flow keeps the block loops below from vectorising.

// All-ones when cond holds, else zero.
inline uint32_t mask_if(bool cond) { return 0u - static_cast<uint32_t>(cond); }

inline float f16_to_f32_inline(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  // Rebias the exponent from 15 to 127.
  const uint32_t normal = ((exp + 112u) << 23) | (mant << 13);
  const uint32_t infnan = 0x7f800000u | (mant << 13);  // keeps the NaN payload
  // Subnormals (and zero) are mant * 2^-24: exact in f32, and at least 2^-24, so a normal
  // f32 that FTZ cannot flush.
  const uint32_t sub = std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(mant)) *
                                               0x1p-24f);
  const uint32_t is_sub = mask_if(exp == 0);
  const uint32_t is_special = mask_if(exp == 31);
  const uint32_t mag =
      (sub & is_sub) | (infnan & is_special) | (normal & ~(is_sub | is_special));
  return std::bit_cast<float>(sign | mag);
}

inline uint16_t f32_to_f16_inline(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;

  // Normal range: rebias 127 -> 15, then round the 13 dropped bits to nearest-even by
  // adding 0xfff plus the lowest kept bit. A carry out of the mantissa correctly bumps the
  // exponent; anything that lands at or past the f16 infinity encoding saturates to inf.
  const uint32_t r = a - (112u << 23);
  uint32_t normal = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  normal = std::min(normal, 0x7c00u);

  // Below 2^-14 the result is an f16 subnormal, i.e. an integer count of 2^-24 units.
  // Scale into those units (exact), split into integer and fraction (both exact, since the
  // value is at most 2^10), and round the fraction to nearest-even by hand. Clamping the
  // bits to 2^-14 keeps the float->int conversion defined in the lanes where this result
  // is discarded (large values, inf, NaN); clamping as an integer avoids a float select,
  // which GCC turns into a branch.
  const float clamped = std::bit_cast<float>(std::min(a, 0x38800000u));
  const float scaled = clamped * 0x1p24f;
  const int32_t whole = static_cast<int32_t>(scaled);
  const float frac = scaled - static_cast<float>(whole);
  const uint32_t q = static_cast<uint32_t>(whole);
  const uint32_t round_up = mask_if(frac > 0.5f) | (mask_if(frac == 0.5f) & (0u - (q & 1u)));
  const uint32_t sub = q + (round_up & 1u);

  // NaN: force the quiet bit and keep the top payload bits so a NaN never becomes inf.
  const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);

  const uint32_t is_nan = mask_if(a > 0x7f800000u);
  const uint32_t is_sub = mask_if(a < 0x38800000u);
  const uint32_t mag = (nan & is_nan) | (sub & is_sub) | (normal & ~(is_nan | is_sub));
  return static_cast<uint16_t>(sign | mag);
}

inline float bf16_to_f32_inline(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline uint16_t f32_to_bf16_inline(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  // Same rounding trick as f16; bf16 shares the f32 exponent, so only overflow of the
  // largest finite values into inf can happen, and the carry produces exactly 0x7f80.
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x40u;  // rounding could turn a NaN into inf
  const bool is_nan = (x & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

// ---------------------------------------------------------------------------------------
// Operators. Integer Sum/Prod go through an unsigned type at least as wide as unsigned int:
// unsigned arithmetic wraps by definition, and widening avoids the promotion of narrow
// unsigned operands to (signed) int. The conversion back is modular since C++20.

template <typename T>
using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct OpSum {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
    } else {
      return a + b;
    }
  }
};

struct OpProd {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
    } else {
      return a * b;
    }
  }
};

// Min/Max match std::min(dst, src) / std::max(dst, src). For floats that means a NaN
// already in dst is kept and a NaN arriving in src is ignored (every comparison with NaN
// is false, so dst wins), and between +0 and -0 dst wins. This is the exact semantics of
// x86 minps/maxps with the operands in this order, so GCC vectorises it without
// -ffast-math. Consequence: a NaN input only survives a reduction if it is on the
// accumulating side, so NaN propagation depends on the reduction order.
struct OpMin {
  template <typename T>
  static T apply(T a, T b) { return b < a ? b : a; }
};

struct OpMax {
  template <typename T>
  static T apply(T a, T b) { return a < b ? b : a; }
};

// ---------------------------------------------------------------------------------------
// Loops. Callers guarantee dst and src do not overlap (reduce_into handles dst == src
// before getting here), which is what lets __restrict unlock vectorisation.
//
// At -O2 GCC (12+) vectorises only with its "very cheap" cost model, which rejects loops
// that need a scalar epilogue, i.e. any loop with an unknown trip count. So the work is
// split into fixed-size inner loops (constant trip count, fully vectorised) plus a short
// scalar tail.

template <typename T, typename Op>
void combine_loop(T* __restrict dst, const T* __restrict src, size_t count) {
  constexpr size_t kLanes = 64 / sizeof(T);
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    T* __restrict d = dst + i;
    const T* __restrict s = src + i;
    for (size_t j = 0; j < kLanes; ++j) d[j] = Op::apply(d[j], s[j]);
  }
  for (; i < count; ++i) dst[i] = Op::apply(dst[i], src[i]);
}

// f16/bf16 are processed in blocks staged in f32 so that each pass is a simple uniform
// loop the vectoriser can handle, instead of one loop mixing conversions and the
// operator. A partial last block is padded through a scratch copy so every block runs the
// same fixed-size code.
constexpr size_t kHalfBlock = 256;

struct F16Conv {
  static float widen(uint16_t h) { return f16_to_f32_inline(h); }
  static uint16_t narrow(float f) { return f32_to_f16_inline(f); }
};

struct BF16Conv {
  static float widen(uint16_t h) { return bf16_to_f32_inline(h); }
  static uint16_t narrow(float f) { return f32_to_bf16_inline(f); }
};

template <typename Conv, typename Op>
void combine_half_block(uint16_t* __restrict d, const uint16_t* __restrict s) {
  alignas(64) float a[kHalfBlock];
  alignas(64) float b[kHalfBlock];
  for (size_t i = 0; i < kHalfBlock; ++i) a[i] = Conv::widen(d[i]);
  for (size_t i = 0; i < kHalfBlock; ++i) b[i] = Conv::widen(s[i]);
  for (size_t i = 0; i < kHalfBlock; ++i) a[i] = Op::apply(a[i], b[i]);
  for (size_t i = 0; i < kHalfBlock; ++i) d[i] = Conv::narrow(a[i]);
}

template <typename Conv, typename Op>
void combine_half_loop(uint16_t* __restrict dst, const uint16_t* __restrict src,
                       size_t count) {
  size_t off = 0;
  for (; off + kHalfBlock <= count; off += kHalfBlock)
    combine_half_block<Conv, Op>(dst + off, src + off);
  if (off < count) {
    const size_t n = count - off;
    alignas(64) uint16_t d[kHalfBlock] = {};
    alignas(64) uint16_t s[kHalfBlock] = {};
    std::memcpy(d, dst + off, n * sizeof(uint16_t));
    std::memcpy(s, src + off, n * sizeof(uint16_t));
    combine_half_block<Conv, Op>(d, s);
    std::memcpy(dst + off, d, n * sizeof(uint16_t));
  }
}

using KernelFn = void (*)(void*, const void*, size_t);

template <typename T, typename Op>
void kernel(void* dst, const void* src, size_t count) {
  combine_loop<T, Op>(static_cast<T*>(dst), static_cast<const T*>(src), count);
}

template <typename Conv, typename Op>
void half_kernel(void* dst, const void* src, size_t count) {
  combine_half_loop<Conv, Op>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                              count);
}

template <typename Op>
KernelFn select_kernel(DType dtype) {
  switch (dtype) {
    case DType::F32: return kernel<float, Op>;
    case DType::F64: return kernel<double, Op>;
    case DType::F16: return half_kernel<F16Conv, Op>;
    case DType::BF16: return half_kernel<BF16Conv, Op>;
    case DType::I8: return kernel<int8_t, Op>;
    case DType::U8: return kernel<uint8_t, Op>;
    case DType::I32: return kernel<int32_t, Op>;
    case DType::U32: return kernel<uint32_t, Op>;
    case DType::I64: return kernel<int64_t, Op>;
    case DType::U64: return kernel<uint64_t, Op>;
  }
  return nullptr;
}

KernelFn select_kernel(DType dtype, RedOp op) {
  switch (op) {
    case RedOp::Sum:
    case RedOp::Avg: return select_kernel<OpSum>(dtype);
    case RedOp::Prod: return select_kernel<OpProd>(dtype);
    case RedOp::Min: return select_kernel<OpMin>(dtype);
    case RedOp::Max: return select_kernel<OpMax>(dtype);
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------
// Average.

template <typename T>
void divide_loop(T* __restrict buf, size_t count, int n) {
  if constexpr (std::is_floating_point_v<T>) {
    // Exact division, not multiplication by 1/n, so the result is the correctly rounded
    // quotient (1/n itself is usually inexact).
    constexpr size_t kLanes = 64 / sizeof(T);
    const T d = static_cast<T>(n);
    size_t i = 0;
    for (; i + kLanes <= count; i += kLanes) {
      T* __restrict p = buf + i;
      for (size_t j = 0; j < kLanes; ++j) p[j] = p[j] / d;
    }
    for (; i < count; ++i) buf[i] = buf[i] / d;
  } else if constexpr (std::is_signed_v<T>) {
    // C++ integer division truncates toward zero, and the quotient of a T by n >= 2
    // always fits back into T.
    const int64_t d = n;
    for (size_t i = 0; i < count; ++i)
      buf[i] = static_cast<T>(static_cast<int64_t>(buf[i]) / d);
  } else {
    const uint64_t d = static_cast<uint64_t>(n);
    for (size_t i = 0; i < count; ++i)
      buf[i] = static_cast<T>(static_cast<uint64_t>(buf[i]) / d);
  }
}

template <typename Conv>
void divide_half_block(uint16_t* __restrict p, float d) {
  alignas(64) float a[kHalfBlock];
  for (size_t i = 0; i < kHalfBlock; ++i) a[i] = Conv::widen(p[i]);
  for (size_t i = 0; i < kHalfBlock; ++i) a[i] = a[i] / d;
  for (size_t i = 0; i < kHalfBlock; ++i) p[i] = Conv::narrow(a[i]);
}

template <typename Conv>
void divide_half_loop(uint16_t* __restrict buf, size_t count, int n) {
  const float d = static_cast<float>(n);
  size_t off = 0;
  for (; off + kHalfBlock <= count; off += kHalfBlock) divide_half_block<Conv>(buf + off, d);
  if (off < count) {
    const size_t m = count - off;
    alignas(64) uint16_t p[kHalfBlock] = {};
    std::memcpy(p, buf + off, m * sizeof(uint16_t));
    divide_half_block<Conv>(p, d);
    std::memcpy(buf + off, p, m * sizeof(uint16_t));
  }
}

}  // namespace

void reduce_into(DType dtype, RedOp op, void* dst, const void* src, size_t count) {
  if (count == 0) return;
  const KernelFn fn = select_kernel(dtype, op);
  if (fn == nullptr) return;
  if (dst != src) {
    fn(dst, src, count);
    return;
  }
  // Fully aliased buffers would violate the __restrict contract of the loops; stage the
  // source through a stack buffer one chunk at a time. Each chunk of src is read before
  // the same chunk of dst is written, so this matches the non-aliased result. Partial
  // overlap has no sensible meaning for a reduction and is not supported.
  alignas(64) unsigned char tmp[4096];
  const size_t esize = dtype_size(dtype);
  const size_t per_chunk = sizeof(tmp) / esize;
  auto* d = static_cast<unsigned char*>(dst);
  for (size_t off = 0; off < count; off += per_chunk) {
    const size_t n = std::min(per_chunk, count - off);
    std::memcpy(tmp, d + off * esize, n * esize);
    fn(d + off * esize, tmp, n);
  }
}

void finish_average(DType dtype, void* buf, size_t count, int n) {
  // n is a participant count; n == 1 is the identity and n <= 0 has no meaningful average
  // (and would divide by zero), so both leave the buffer as is.
  if (n <= 1 || count == 0) return;
  switch (dtype) {
    case DType::F32: divide_loop(static_cast<float*>(buf), count, n); break;
    case DType::F64: divide_loop(static_cast<double*>(buf), count, n); break;
    case DType::F16: divide_half_loop<F16Conv>(static_cast<uint16_t*>(buf), count, n); break;
    case DType::BF16: divide_half_loop<BF16Conv>(static_cast<uint16_t*>(buf), count, n); break;
    case DType::I8: divide_loop(static_cast<int8_t*>(buf), count, n); break;
    case DType::U8: divide_loop(static_cast<uint8_t*>(buf), count, n); break;
    case DType::I32: divide_loop(static_cast<int32_t*>(buf), count, n); break;
    case DType::U32: divide_loop(static_cast<uint32_t*>(buf), count, n); break;
    case DType::I64: divide_loop(static_cast<int64_t*>(buf), count, n); break;
    case DType::U64: divide_loop(static_cast<uint64_t*>(buf), count, n); break;
  }
}

float f16_to_f32(uint16_t h) { return f16_to_f32_inline(h); }
uint16_t f32_to_f16(float f) { return f32_to_f16_inline(f); }
float bf16_to_f32(uint16_t h) { return bf16_to_f32_inline(h); }
uint16_t f32_to_bf16(float f) { return f32_to_bf16_inline(f); }

void combine_in_order(DType dtype, RedOp op, void* dst, std::span<const void* const> inputs,
                      size_t count) {
  if (inputs.empty() || count == 0) return;
  std::memcpy(dst, inputs[0], count * dtype_size(dtype));
  for (size_t k = 1; k < inputs.size(); ++k) reduce_into(dtype, op, dst, inputs[k], count);
  if (op == RedOp::Avg) finish_average(dtype, dst, count, static_cast<int>(inputs.size()));
}

}  // namespace taiji
