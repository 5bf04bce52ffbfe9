#include "collectives/sum_squares.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "collectives/reduce_kernels.h"

namespace taiji {

namespace {

// Eight independent fp64 accumulators: the adds do not wait on each other, and the fixed
// inner trip count lets the loop vectorise (the order of additions, and so the result,
// does not depend on the instruction set).
template <typename T, typename Widen>
inline double sum_squares(const T* p, size_t n, Widen widen) {
  constexpr size_t kLanes = 8;
  double acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      const double v = widen(p[i + k]);
      acc[k] += v * v;
    }
  }
  for (; i < n; ++i) {
    const double v = widen(p[i]);
    acc[0] += v * v;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// The f32 and f64 loops run on the critical path of a statistics-carrying allreduce: an
// AVX2 build of them, chosen once at run time where the CPU has it, does four lanes per
// instruction. Chosen by a plain check rather than an ifunc (target_clones): ifunc
// resolvers run during relocation, before a sanitizer runtime is ready.
// float and double widen to double exactly.
template <typename T>
double sum_squares_base(const T* p, size_t n) {
  return sum_squares(p, n, [](T v) { return static_cast<double>(v); });
}

#if defined(__x86_64__) && defined(__GNUC__)
template <typename T>
[[gnu::target("avx2")]] double sum_squares_avx2(const T* p, size_t n) {
  return sum_squares(p, n, [](T v) { return static_cast<double>(v); });
}
bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
template <typename T>
double sum_squares_fast(const T* p, size_t n) {
  return have_avx2() ? sum_squares_avx2(p, n) : sum_squares_base(p, n);
}
#else
template <typename T>
double sum_squares_fast(const T* p, size_t n) {
  return sum_squares_base(p, n);
}
#endif

constexpr size_t kBlockBytes = 8 << 10;

}  // namespace

double squared_norm(DType dtype, const void* data, size_t count) {
  switch (dtype) {
    case DType::F32:
      return sum_squares_fast(static_cast<const float*>(data), count);
    case DType::F64:
      return sum_squares_fast(static_cast<const double*>(data), count);
    case DType::F16:
      return sum_squares(static_cast<const uint16_t*>(data), count,
                         [](uint16_t v) { return static_cast<double>(f16_to_f32(v)); });
    case DType::BF16:
      return sum_squares(static_cast<const uint16_t*>(data), count,
                         [](uint16_t v) { return static_cast<double>(bf16_to_f32(v)); });
    default:
      return std::nan("");
  }
}

void reduce_into_counting(DType dtype, RedOp op, void* dst, const void* src, size_t count,
                          double* before, double* after) {
  // Nothing to count: one call over the whole range, without the per-block dispatch.
  if (before == nullptr && after == nullptr) {
    reduce_into(dtype, op, dst, src, count);
    return;
  }
  const size_t elem = dtype_size(dtype);
  const size_t block = std::max<size_t>(1, kBlockBytes / elem);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t off = 0; off < count; off += block) {
    const size_t n = std::min(block, count - off);
    uint8_t* db = d + off * elem;
    if (before != nullptr) *before += squared_norm(dtype, db, n);
    reduce_into(dtype, op, db, s + off * elem, n);
    if (after != nullptr) *after += squared_norm(dtype, db, n);
  }
}

}  // namespace taiji
