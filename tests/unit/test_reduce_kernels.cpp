#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "collectives/reduce_kernels.h"

using namespace taiji;

namespace {

// Odd lengths hit both the vectorised body and the scalar tail; 4099 spans several f16
// blocks plus a partial one.
constexpr size_t kLengths[] = {0, 1, 7, 1000, 4099};
// A non-zero start offset moves the arrays off vector alignment.
constexpr size_t kOffsets[] = {0, 3};
constexpr RedOp kOps[] = {RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg};

// ---- scalar references ------------------------------------------------------------------

// Wrap-around computed independently of the kernel: everything in uint64_t (where the
// conversion of a signed value sign-extends, preserving the residue mod 2^bits) and then
// truncated back to T.
template <typename T>
T ref_int(RedOp op, T a, T b) {
  const auto ua = static_cast<uint64_t>(a);
  const auto ub = static_cast<uint64_t>(b);
  switch (op) {
    case RedOp::Sum:
    case RedOp::Avg: return static_cast<T>(ua + ub);
    case RedOp::Prod: return static_cast<T>(ua * ub);
    case RedOp::Min: return std::min(a, b);
    case RedOp::Max: return std::max(a, b);
  }
  return T{};
}

// The contract is std::min(dst, src) / std::max(dst, src).
template <typename F>
F ref_float(RedOp op, F a, F b) {
  switch (op) {
    case RedOp::Sum:
    case RedOp::Avg: return a + b;
    case RedOp::Prod: return a * b;
    case RedOp::Min: return std::min(a, b);
    case RedOp::Max: return std::max(a, b);
  }
  return F{};
}

bool is_f16_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool is_bf16_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

template <typename T>
bool same_value(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) && std::isnan(b)) return true;
  }
  // Bitwise, so +0 and -0 are told apart.
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// ---- random inputs ------------------------------------------------------------------------

template <typename T>
std::vector<T> random_ints(std::mt19937_64& rng, size_t n) {
  std::vector<T> v(n);
  const T edges[] = {std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), T(0), T(1),
                     static_cast<T>(-1)};
  for (size_t i = 0; i < n; ++i) {
    // Mostly full-range values (sums and products wrap constantly), with the extremes
    // mixed in so min/max and the wrap edges are always present.
    v[i] = (rng() % 8 == 0) ? edges[rng() % 5] : static_cast<T>(rng());
  }
  return v;
}

template <typename F>
std::vector<F> random_floats(std::mt19937_64& rng, size_t n) {
  std::vector<F> v(n);
  std::uniform_real_distribution<F> dist(F(-100), F(100));
  const F specials[] = {std::numeric_limits<F>::quiet_NaN(), std::numeric_limits<F>::infinity(),
                        -std::numeric_limits<F>::infinity(),  F(0),
                        -F(0),                                 std::numeric_limits<F>::denorm_min(),
                        std::numeric_limits<F>::max(),         std::numeric_limits<F>::lowest()};
  for (size_t i = 0; i < n; ++i) v[i] = (rng() % 16 == 0) ? specials[rng() % 8] : dist(rng);
  return v;
}

std::vector<uint16_t> random_halves(std::mt19937_64& rng, size_t n) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = static_cast<uint16_t>(rng());
  return v;
}

// Runs reduce_into on every length/offset and compares each element with ref(dst, src).
// Returns a description of the first mismatch, or an empty string.
template <typename T, typename Gen, typename Ref, typename Eq>
std::string check_reduce(DType dt, RedOp op, Gen gen, Ref ref, Eq eq) {
  std::mt19937_64 rng(0x5eed0000u + static_cast<unsigned>(dt) * 16 + static_cast<unsigned>(op));
  for (size_t len : kLengths) {
    for (size_t offset : kOffsets) {
      std::vector<T> dst = gen(rng, len + offset);
      const std::vector<T> src = gen(rng, len + offset);
      const std::vector<T> dst_before = dst;
      const std::vector<T> src_before = src;
      reduce_into(dt, op, dst.data() + offset, src.data() + offset, len);
      for (size_t i = 0; i < len + offset; ++i) {
        const T want = i < offset ? dst_before[i] : ref(op, dst_before[i], src_before[i]);
        if (!eq(dst[i], want) || std::memcmp(&src[i], &src_before[i], sizeof(T)) != 0) {
          return std::string(dtype_name(dt)) + " " + std::string(redop_name(op)) +
                 " len=" + std::to_string(len) + " offset=" + std::to_string(offset) +
                 " index=" + std::to_string(i);
        }
      }
    }
  }
  return {};
}

template <typename T>
void check_int_dtype(DType dt) {
  for (RedOp op : kOps) {
    const std::string err = check_reduce<T>(dt, op, random_ints<T>, ref_int<T>,
                                            [](T a, T b) { return a == b; });
    INFO(err);
    CHECK(err.empty());
  }
}

template <typename F>
void check_float_dtype(DType dt) {
  for (RedOp op : kOps) {
    const std::string err =
        check_reduce<F>(dt, op, random_floats<F>, ref_float<F>, same_value<F>);
    INFO(err);
    CHECK(err.empty());
  }
}

// ---- f16 / bf16 references ----------------------------------------------------------------

// The exact value of an f16 bit pattern, from the format definition.
double f16_value(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? std::numeric_limits<double>::quiet_NaN()
                             : sign * std::numeric_limits<double>::infinity();
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// Round-to-nearest-even by search over the sorted non-negative f16 values; the pattern
// after the largest finite one (0x7c00) stands for 2^16, the value it would have with an
// unbounded exponent, so overflow falls out of the same rule.
uint16_t ref_f32_to_f16(float x) {
  static const std::vector<double> table = [] {
    std::vector<double> t(0x7c01);
    for (uint32_t h = 0; h < 0x7c00; ++h) t[h] = f16_value(static_cast<uint16_t>(h));
    t[0x7c00] = 65536.0;
    return t;
  }();
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65536.0) return sign | 0x7c00;
  const auto hi = static_cast<uint16_t>(std::upper_bound(table.begin(), table.end(), a) -
                                        table.begin());
  const auto lo = static_cast<uint16_t>(hi - 1);  // table[lo] <= a < table[hi]
  const double dlo = a - table[lo];
  const double dhi = table[hi] - a;
  const uint16_t mag = (dlo < dhi || (dlo == dhi && (lo & 1) == 0)) ? lo : hi;
  return sign | mag;
}

float next_up(float x) { return std::nextafter(x, std::numeric_limits<float>::infinity()); }
float next_down(float x) { return std::nextafter(x, -std::numeric_limits<float>::infinity()); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

}  // namespace

// ---- reduce_into ----------------------------------------------------------------------------

TEST_CASE("reduce_into integers match a wrapping scalar reference", "[kernels]") {
  check_int_dtype<int8_t>(DType::I8);
  check_int_dtype<uint8_t>(DType::U8);
  check_int_dtype<int32_t>(DType::I32);
  check_int_dtype<uint32_t>(DType::U32);
  check_int_dtype<int64_t>(DType::I64);
  check_int_dtype<uint64_t>(DType::U64);
}

TEST_CASE("reduce_into f32/f64 equal the scalar computation exactly", "[kernels]") {
  check_float_dtype<float>(DType::F32);
  check_float_dtype<double>(DType::F64);
}

TEST_CASE("reduce_into f16/bf16 equal widen-combine-round per element", "[kernels]") {
  auto f16_ref = [](RedOp op, uint16_t a, uint16_t b) {
    return f32_to_f16(ref_float(op, f16_to_f32(a), f16_to_f32(b)));
  };
  auto bf16_ref = [](RedOp op, uint16_t a, uint16_t b) {
    return f32_to_bf16(ref_float(op, bf16_to_f32(a), bf16_to_f32(b)));
  };
  auto f16_eq = [](uint16_t a, uint16_t b) { return a == b || (is_f16_nan(a) && is_f16_nan(b)); };
  auto bf16_eq = [](uint16_t a, uint16_t b) {
    return a == b || (is_bf16_nan(a) && is_bf16_nan(b));
  };
  for (RedOp op : kOps) {
    const std::string e1 = check_reduce<uint16_t>(DType::F16, op, random_halves, f16_ref, f16_eq);
    INFO(e1);
    CHECK(e1.empty());
    const std::string e2 =
        check_reduce<uint16_t>(DType::BF16, op, random_halves, bf16_ref, bf16_eq);
    INFO(e2);
    CHECK(e2.empty());
  }
}

TEST_CASE("reduce_into f16 sums round to nearest even", "[kernels]") {
  // 1 + 2^-11 is halfway between 1 and the next f16 (1 + 2^-10): ties go to the even 1.0.
  uint16_t dst[2] = {0x3C00, 0x3C01};              // 1.0, 1 + 2^-10
  const uint16_t src[2] = {0x1000, 0x1000};        // 2^-11 each
  reduce_into(DType::F16, RedOp::Sum, dst, src, 2);
  CHECK(dst[0] == 0x3C00);
  CHECK(dst[1] == 0x3C02);  // 1 + 3 * 2^-11 -> even neighbour 1 + 2^-9
}

TEST_CASE("reduce_into integer sum and product wrap around", "[kernels]") {
  {
    int8_t d[] = {127, -128, -128, 100};
    const int8_t s[] = {1, -1, -128, 100};
    reduce_into(DType::I8, RedOp::Sum, d, s, 4);
    CHECK(d[0] == -128);
    CHECK(d[1] == 127);
    CHECK(d[2] == 0);
    CHECK(d[3] == -56);
  }
  {
    int8_t d[] = {-128, 16, 127};
    const int8_t s[] = {-1, 16, 127};
    reduce_into(DType::I8, RedOp::Prod, d, s, 3);
    CHECK(d[0] == -128);
    CHECK(d[1] == 0);
    CHECK(d[2] == 1);  // 16129 mod 256
  }
  {
    uint8_t d[] = {255, 200};
    const uint8_t s[] = {1, 2};
    reduce_into(DType::U8, RedOp::Sum, d, s, 1);
    reduce_into(DType::U8, RedOp::Prod, d + 1, s + 1, 1);
    CHECK(d[0] == 0);
    CHECK(d[1] == 144);
  }
  {
    int32_t d[] = {INT32_MAX, INT32_MIN};
    const int32_t s[] = {1, -1};
    reduce_into(DType::I32, RedOp::Sum, d, s, 2);
    CHECK(d[0] == INT32_MIN);
    CHECK(d[1] == INT32_MAX);
    int32_t p[] = {INT32_MIN, 65536};
    const int32_t q[] = {-1, 65536};
    reduce_into(DType::I32, RedOp::Prod, p, q, 2);
    CHECK(p[0] == INT32_MIN);
    CHECK(p[1] == 0);
  }
  {
    uint32_t d[] = {UINT32_MAX, 0x10000};
    const uint32_t s[] = {1, 0x10000};
    reduce_into(DType::U32, RedOp::Sum, d, s, 1);
    reduce_into(DType::U32, RedOp::Prod, d + 1, s + 1, 1);
    CHECK(d[0] == 0);
    CHECK(d[1] == 0);
  }
  {
    int64_t d[] = {INT64_MAX, INT64_MIN};
    const int64_t s[] = {1, -1};
    reduce_into(DType::I64, RedOp::Sum, d, s, 2);
    CHECK(d[0] == INT64_MIN);
    CHECK(d[1] == INT64_MAX);
    int64_t p[] = {INT64_MIN, INT64_MAX};
    const int64_t q[] = {-1, 2};
    reduce_into(DType::I64, RedOp::Prod, p, q, 2);
    CHECK(p[0] == INT64_MIN);
    CHECK(p[1] == -2);
  }
  {
    uint64_t d[] = {UINT64_MAX, UINT64_MAX};
    const uint64_t s[] = {1, UINT64_MAX};
    reduce_into(DType::U64, RedOp::Sum, d, s, 1);
    reduce_into(DType::U64, RedOp::Prod, d + 1, s + 1, 1);
    CHECK(d[0] == 0);
    CHECK(d[1] == 1);
  }
}

TEST_CASE("reduce_into Avg combines like Sum", "[kernels]") {
  int32_t d[] = {5, -7};
  const int32_t s[] = {6, 2};
  reduce_into(DType::I32, RedOp::Avg, d, s, 2);
  CHECK(d[0] == 11);
  CHECK(d[1] == -5);
}

TEST_CASE("reduce_into float min/max keep dst on NaN and signed-zero ties", "[kernels]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float mn[] = {nan, 1.0f, 0.0f, -0.0f, 2.0f};
  float mx[] = {nan, 1.0f, 0.0f, -0.0f, 2.0f};
  const float s[] = {1.0f, nan, -0.0f, 0.0f, -3.0f};
  reduce_into(DType::F32, RedOp::Min, mn, s, 5);
  reduce_into(DType::F32, RedOp::Max, mx, s, 5);
  CHECK(std::isnan(mn[0]));
  CHECK(std::isnan(mx[0]));
  CHECK(mn[1] == 1.0f);
  CHECK(mx[1] == 1.0f);
  CHECK_FALSE(std::signbit(mn[2]));
  CHECK_FALSE(std::signbit(mx[2]));
  CHECK(std::signbit(mn[3]));
  CHECK(std::signbit(mx[3]));
  CHECK(mn[4] == -3.0f);
  CHECK(mx[4] == 2.0f);
}

TEST_CASE("reduce_into with dst == src combines each element with itself", "[kernels]") {
  std::vector<int32_t> v(5000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i) - 2500;
  reduce_into(DType::I32, RedOp::Sum, v.data(), v.data(), v.size());
  size_t bad = 0;
  for (size_t i = 0; i < v.size(); ++i) bad += v[i] != 2 * (static_cast<int32_t>(i) - 2500);
  CHECK(bad == 0);

  std::vector<uint16_t> h(700, 0x3C00);  // 1.0 in f16
  reduce_into(DType::F16, RedOp::Sum, h.data(), h.data(), h.size());
  CHECK(std::all_of(h.begin(), h.end(), [](uint16_t x) { return x == 0x4000; }));
}

TEST_CASE("reduce_into with count 0 touches nothing", "[kernels]") {
  for (int t = 0; t < kDTypeCount; ++t) {
    for (RedOp op : kOps) {
      uint64_t d = 0x0123456789abcdefull;
      const uint64_t s = 0xfedcba9876543210ull;
      reduce_into(static_cast<DType>(t), op, &d, &s, 0);
      CHECK(d == 0x0123456789abcdefull);
    }
  }
}

// ---- f16 conversions ------------------------------------------------------------------------

TEST_CASE("f16 to f32 is exact for all 65536 patterns and round-trips", "[kernels]") {
  size_t bad_value = 0, bad_trip = 0;
  for (uint32_t i = 0; i < 0x10000; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float x = f16_to_f32(h);
    const double want = f16_value(h);
    const uint16_t back = f32_to_f16(x);
    if (is_f16_nan(h)) {
      bad_value += !std::isnan(x) || std::signbit(x) != ((h & 0x8000) != 0);
      bad_trip += !is_f16_nan(back) || (back & 0x8000) != (h & 0x8000);
    } else {
      bad_value += !same_value(static_cast<double>(x), want);
      bad_trip += back != h;
    }
  }
  CHECK(bad_value == 0);
  CHECK(bad_trip == 0);
}

TEST_CASE("f16 conversion of known values", "[kernels]") {
  CHECK(f32_to_f16(1.0f) == 0x3C00);
  CHECK(f16_to_f32(0x3C00) == 1.0f);
  CHECK(f32_to_f16(-2.0f) == 0xC000);
  CHECK(f32_to_f16(65504.0f) == 0x7BFF);
  CHECK(f16_to_f32(0x7BFF) == 65504.0f);
  CHECK(f32_to_f16(65520.0f) == 0x7C00);             // halfway to 2^16: ties to even = inf
  CHECK(f32_to_f16(next_down(65520.0f)) == 0x7BFF);
  CHECK(f32_to_f16(1e10f) == 0x7C00);
  CHECK(f32_to_f16(-1e10f) == 0xFC00);
  CHECK(f32_to_f16(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(f32_to_f16(-std::numeric_limits<float>::infinity()) == 0xFC00);
  CHECK(std::isinf(f16_to_f32(0x7C00)));
  CHECK(f32_to_f16(0.0f) == 0x0000);
  CHECK(f32_to_f16(-0.0f) == 0x8000);
  CHECK(std::signbit(f16_to_f32(0x8000)));
  // Subnormals.
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(f16_to_f32(0x03FF) == std::ldexp(1023.0f, -24));
  CHECK(f16_to_f32(0x0400) == std::ldexp(1.0f, -14));
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);            // tie -> even 0
  CHECK(f32_to_f16(next_up(std::ldexp(1.0f, -25))) == 0x0001);
  CHECK(f32_to_f16(std::ldexp(3.0f, -25)) == 0x0002);            // 1.5 units: tie -> 2
  CHECK(f32_to_f16(std::ldexp(5.0f, -25)) == 0x0002);            // 2.5 units: tie -> 2
  CHECK(f32_to_f16(-std::ldexp(1.0f, -26)) == 0x8000);
  CHECK(f32_to_f16(std::ldexp(2047.0f, -25)) == 0x0400);         // rounds up into normals
  CHECK(f32_to_f16(std::numeric_limits<float>::denorm_min()) == 0x0000);
  // Ties to even in the normal range.
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);
  CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);
  CHECK(f32_to_f16(next_up(1.0f + std::ldexp(1.0f, -11))) == 0x3C01);
  // NaN stays NaN, including a signalling NaN whose payload lies in bits f16 drops.
  CHECK(is_f16_nan(f32_to_f16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(is_f16_nan(f32_to_f16(from_bits(0x7F800001u))));
  CHECK((f32_to_f16(from_bits(0xFF800001u)) & 0x8000) != 0);
  CHECK(std::isnan(f16_to_f32(0x7E00)));
  CHECK(std::isnan(f16_to_f32(0x7C01)));
}

TEST_CASE("f32 to f16 rounds every midpoint to even", "[kernels]") {
  // For each pair of adjacent non-negative f16 values (the last pair being 65504 and the
  // overflow threshold 2^16), the midpoint and its f32 neighbours, with both signs.
  size_t bad = 0;
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const double lo = f16_value(static_cast<uint16_t>(h));
    const double hi = h == 0x7BFF ? 65536.0 : f16_value(static_cast<uint16_t>(h + 1));
    const auto mid = static_cast<float>((lo + hi) / 2);  // exact: needs 12 significant bits
    const auto even = static_cast<uint16_t>((h & 1) ? h + 1 : h);
    for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const float s = sign ? -1.0f : 1.0f;
      bad += f32_to_f16(s * static_cast<float>(lo)) != (sign | h);
      bad += f32_to_f16(s * mid) != (sign | even);
      bad += f32_to_f16(s * next_down(mid)) != (sign | h);
      bad += f32_to_f16(s * next_up(mid)) != (sign | (h + 1));
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("f32 to f16 matches a search-based reference on random inputs", "[kernels]") {
  std::mt19937 rng(12345);
  size_t bad = 0;
  for (int i = 0; i < 400000; ++i) {
    uint32_t bits = rng();
    // Every other sample is steered into and around the f16 range (exponents 2^-27..2^17)
    // where the interesting rounding happens.
    if (i & 1) bits = (bits & 0x807FFFFFu) | ((100u + rng() % 45) << 23);
    const float x = from_bits(bits);
    if (std::isnan(x)) continue;
    bad += f32_to_f16(x) != ref_f32_to_f16(x);
  }
  CHECK(bad == 0);
}

// ---- bf16 conversions -----------------------------------------------------------------------

TEST_CASE("bf16 to f32 is exact for all 65536 patterns and round-trips", "[kernels]") {
  size_t bad_value = 0, bad_trip = 0;
  for (uint32_t i = 0; i < 0x10000; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float x = bf16_to_f32(h);
    bad_value += std::bit_cast<uint32_t>(x) != (i << 16);
    const uint16_t back = f32_to_bf16(x);
    if (is_bf16_nan(h)) {
      bad_trip += !is_bf16_nan(back) || (back & 0x8000) != (h & 0x8000);
    } else {
      bad_trip += back != h;
    }
  }
  CHECK(bad_value == 0);
  CHECK(bad_trip == 0);
}

TEST_CASE("bf16 conversion of known values and ties", "[kernels]") {
  CHECK(f32_to_bf16(1.0f) == 0x3F80);
  CHECK(bf16_to_f32(0x3F80) == 1.0f);
  CHECK(f32_to_bf16(-2.0f) == 0xC000);
  CHECK(f32_to_bf16(from_bits(0x3F808000u)) == 0x3F80);  // tie -> even
  CHECK(f32_to_bf16(from_bits(0x3F818000u)) == 0x3F82);  // tie -> even (up)
  CHECK(f32_to_bf16(from_bits(0x3F808001u)) == 0x3F81);
  CHECK(f32_to_bf16(from_bits(0x3F807FFFu)) == 0x3F80);
  CHECK(f32_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);  // overflows to inf
  CHECK(f32_to_bf16(from_bits(0x7F7F7FFFu)) == 0x7F7F);
  CHECK(f32_to_bf16(-std::numeric_limits<float>::infinity()) == 0xFF80);
  CHECK(f32_to_bf16(-0.0f) == 0x8000);
  CHECK(f32_to_bf16(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(f32_to_bf16(from_bits(0x00018000u)) == 0x0002);  // subnormal tie -> even
  // NaN stays NaN (quiet), even when all payload bits are in the dropped half.
  CHECK(is_bf16_nan(f32_to_bf16(from_bits(0x7F800001u))));
  CHECK(is_bf16_nan(f32_to_bf16(from_bits(0xFFFFFFFFu))));
  CHECK((f32_to_bf16(from_bits(0x7F800001u)) & 0x40) != 0);
  CHECK(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()) == 0x7FC0);
}

TEST_CASE("f32 to bf16 rounds every midpoint to even", "[kernels]") {
  size_t bad = 0;
  for (uint32_t h = 0; h < 0x7F80; ++h) {
    const auto even = (h & 1) ? h + 1 : h;
    for (uint32_t sign : {0u, 0x8000u}) {
      const uint32_t base = (sign | h) << 16;
      bad += f32_to_bf16(from_bits(base)) != (sign | h);
      bad += f32_to_bf16(from_bits(base | 0x8000u)) != (sign | even);
      bad += f32_to_bf16(from_bits(base | 0x7FFFu)) != (sign | h);
      bad += f32_to_bf16(from_bits(base | 0x8001u)) != (sign | (h + 1));
    }
  }
  CHECK(bad == 0);
}

// ---- finish_average ---------------------------------------------------------------------------

TEST_CASE("finish_average truncates integers toward zero", "[kernels]") {
  {
    int32_t v[] = {-7, 7, -1, 1, 0, INT32_MIN, INT32_MAX};
    finish_average(DType::I32, v, 7, 2);
    CHECK(v[0] == -3);
    CHECK(v[1] == 3);
    CHECK(v[2] == 0);
    CHECK(v[3] == 0);
    CHECK(v[4] == 0);
    CHECK(v[5] == INT32_MIN / 2);
    CHECK(v[6] == INT32_MAX / 2);
  }
  {
    int8_t v[] = {-128, 127, -5};
    finish_average(DType::I8, v, 3, 3);
    CHECK(v[0] == -42);
    CHECK(v[1] == 42);
    CHECK(v[2] == -1);
  }
  {
    uint8_t v[] = {255, 1};
    finish_average(DType::U8, v, 2, 2);
    CHECK(v[0] == 127);
    CHECK(v[1] == 0);
  }
  {
    uint32_t v[] = {UINT32_MAX};
    finish_average(DType::U32, v, 1, 4);
    CHECK(v[0] == UINT32_MAX / 4);
  }
  {
    int64_t v[] = {INT64_MIN, -9};
    finish_average(DType::I64, v, 2, 4);
    CHECK(v[0] == INT64_MIN / 4);
    CHECK(v[1] == -2);
  }
  {
    uint64_t v[] = {UINT64_MAX};
    finish_average(DType::U64, v, 1, 3);
    CHECK(v[0] == UINT64_MAX / 3);
  }
}

TEST_CASE("finish_average divides floats exactly in their compute type", "[kernels]") {
  std::mt19937_64 rng(99);
  for (size_t len : kLengths) {
    for (int n : {1, 3, 7}) {
      std::vector<float> a = random_floats<float>(rng, len);
      std::vector<double> b = random_floats<double>(rng, len);
      std::vector<uint16_t> h = random_halves(rng, len);
      std::vector<uint16_t> g = random_halves(rng, len);
      const auto a0 = a;
      const auto b0 = b;
      const auto h0 = h;
      const auto g0 = g;
      finish_average(DType::F32, a.data(), len, n);
      finish_average(DType::F64, b.data(), len, n);
      finish_average(DType::F16, h.data(), len, n);
      finish_average(DType::BF16, g.data(), len, n);
      size_t bad = 0;
      for (size_t i = 0; i < len; ++i) {
        bad += !same_value(a[i], a0[i] / static_cast<float>(n));
        bad += !same_value(b[i], b0[i] / static_cast<double>(n));
        const uint16_t hw = f32_to_f16(f16_to_f32(h0[i]) / static_cast<float>(n));
        bad += !(h[i] == hw || (is_f16_nan(h[i]) && is_f16_nan(hw)));
        const uint16_t gw = f32_to_bf16(bf16_to_f32(g0[i]) / static_cast<float>(n));
        bad += !(g[i] == gw || (is_bf16_nan(g[i]) && is_bf16_nan(gw)));
      }
      INFO("len=" << len << " n=" << n);
      CHECK(bad == 0);
    }
  }
  float third[] = {1.0f, 3.0f, -3.0f};
  finish_average(DType::F32, third, 3, 3);
  CHECK(third[0] == 1.0f / 3.0f);
  CHECK(third[1] == 1.0f);
  CHECK(third[2] == -1.0f);
  uint16_t h[] = {0x4200, 0x3C00};  // 3.0, 1.0
  finish_average(DType::F16, h, 2, 2);
  CHECK(h[0] == 0x3E00);  // 1.5
  CHECK(h[1] == 0x3800);  // 0.5
  uint16_t bf[] = {0x4040};  // 3.0
  finish_average(DType::BF16, bf, 1, 2);
  CHECK(bf[0] == 0x3FC0);  // 1.5
}

TEST_CASE("finish_average over long integer arrays", "[kernels]") {
  std::mt19937_64 rng(7);
  const std::vector<int64_t> v0 = random_ints<int64_t>(rng, 4099);
  std::vector<int64_t> v = v0;
  std::vector<int8_t> w0 = random_ints<int8_t>(rng, 4099);
  std::vector<int8_t> w = w0;
  finish_average(DType::I64, v.data(), v.size(), 5);
  finish_average(DType::I8, w.data(), w.size(), 5);
  size_t bad = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    bad += v[i] != v0[i] / 5;
    bad += w[i] != static_cast<int8_t>(w0[i] / 5);
  }
  CHECK(bad == 0);
}
