// Sums of squares taken while a collective already reads the data, for the gradient
// statistics: this rank's input norm as each chunk of it is first read (fused into the
// reduction where this rank reduces the chunk), and the result's norm over the chunks whose
// reduction ends here (fused into the last combine). A separate pass over a large buffer
// before and after the reduction would cost more than the rest of the statistics together.
#pragma once

#include <cstddef>
#include <functional>

#include "common/dtype.h"

namespace taiji {

// sum of x^2 over count elements of dtype (a float type), accumulated in fp64; NaN for
// other dtypes.
double squared_norm(DType dtype, const void* data, size_t count);

// reduce_into (reduce_kernels.h), adding the sum of squares of dst before the combine to
// *before and after it to *after (either may be null), block by block so that the extra
// reads hit the L1 cache. With both null it is exactly reduce_into.
void reduce_into_counting(DType dtype, RedOp op, void* dst, const void* src, size_t count,
                          double* before, double* after);

// Filled by an allreduce on its peer's I/O thread.
struct NormTap {
  double local = 0;   // sum of squares of this rank's input
  // Sum of squares of the result (after AVG's division) over the chunks whose reduction
  // ends on this rank: summed over the ranks, the result's.
  double rooted = 0;
  // Runs once, on the I/O thread, as soon as both are complete: usually well before the op
  // ends, since the broadcast half still runs.
  std::function<void(double local, double rooted)> on_counted;
};

}  // namespace taiji
