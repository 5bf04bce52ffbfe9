// Element-wise reduction kernels, one per (dtype, op). Written as plain loops over
// contiguous arrays so the compiler vectorises them; f16 and bf16 are widened to f32,
// combined, and rounded back to nearest-even per element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/dtype.h"

namespace taiji {

// dst[i] = dst[i] (op) src[i] for i < count. Avg combines like Sum (divide later with
// finish_average). Integer Sum/Prod wrap modulo 2^bits (two's complement), as in MPI.
void reduce_into(DType dtype, RedOp op, void* dst, const void* src, size_t count);

// buf[i] /= n, for the Avg operator after all contributions were summed. Integers use
// truncating division (toward zero).
void finish_average(DType dtype, void* buf, size_t count, int n);

// dst = inputs[0] (op) inputs[1] (op) ... in that order, then divided by the number of
// inputs for Avg: a serial reduction, the same bits on every rank that runs it on the
// same inputs. dst may not overlap an input.
void combine_in_order(DType dtype, RedOp op, void* dst, std::span<const void* const> inputs,
                      size_t count);

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);   // round to nearest, ties to even; overflow -> inf; NaN kept
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest, ties to even; NaN kept quiet

}  // namespace taiji
