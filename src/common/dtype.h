// Element types and reduction operators as the runtime sees them. The numeric values are
// part of the wire format and equal the public taiji_dtype_t / taiji_reduce_op_t values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace taiji {

enum class DType : uint8_t { F32 = 0, F64, F16, BF16, I8, U8, I32, U32, I64, U64 };
constexpr int kDTypeCount = 10;

enum class RedOp : uint8_t { Sum = 0, Prod, Min, Max, Avg };
constexpr int kRedOpCount = 5;

constexpr bool valid_dtype(uint32_t v) { return v < kDTypeCount; }
constexpr bool valid_redop(uint32_t v) { return v < kRedOpCount; }

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: case DType::U32: return 4;
    case DType::F64: case DType::I64: case DType::U64: return 8;
    case DType::F16: case DType::BF16: return 2;
    case DType::I8: case DType::U8: return 1;
  }
  return 0;
}

constexpr bool dtype_is_float(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}

constexpr std::string_view dtype_name(DType t) {
  constexpr std::string_view names[] = {"f32", "f64", "f16", "bf16", "i8",
                                        "u8",  "i32", "u32", "i64",  "u64"};
  return static_cast<int>(t) < kDTypeCount ? names[static_cast<int>(t)] : "?";
}

constexpr std::string_view redop_name(RedOp o) {
  constexpr std::string_view names[] = {"sum", "prod", "min", "max", "avg"};
  return static_cast<int>(o) < kRedOpCount ? names[static_cast<int>(o)] : "?";
}

}  // namespace taiji
