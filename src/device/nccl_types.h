// How taiji's element types, reduction operators, op kinds and NCCL's result codes meet.
// NCCL's values are plain ints here, equal to nccl.h's enums (nccl_types.cpp checks them
// against the header when it is present), so that a build without NCCL can still name and
// test the mapping.
#pragma once

#include "common/dtype.h"
#include "common/op_kind.h"
#include "common/status.h"

namespace taiji {

namespace nccl {
// ncclDataType_t
constexpr int kInt8 = 0, kUint8 = 1, kInt32 = 2, kUint32 = 3, kInt64 = 4, kUint64 = 5,
              kFloat16 = 6, kFloat32 = 7, kFloat64 = 8, kBfloat16 = 9;
// ncclRedOp_t: note that NCCL orders max before min, taiji min before max.
constexpr int kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4;
// ncclResult_t
constexpr int kSuccess = 0, kUnhandledCudaError = 1, kSystemError = 2, kInternalError = 3,
              kInvalidArgument = 4, kInvalidUsage = 5, kRemoteError = 6, kInProgress = 7;
}  // namespace nccl

// The ncclDataType_t of `t`, or Unsupported for a value off taiji's list.
Result<int> nccl_dtype(DType t);
// The ncclRedOp_t of `o` (Avg is ncclAvg: integers truncate, as on the host), or
// Unsupported for a value off taiji's list.
Result<int> nccl_redop(RedOp o);

// Ok for the kinds the device backend runs (allreduce, broadcast, reduce, allgather,
// reduce_scatter); Unsupported, saying which kinds it does run, for the others.
Status device_op_supported(OpKind k);

// What an ncclResult_t means to taiji: Ok, InProgress, InvalidArgument (invalid argument
// or usage), Io (a system call failed), PeerLost (a remote peer failed), else Internal.
Code nccl_result_code(int result);
// "ncclRemoteError", ...; "unknown ncclResult_t" for values off the list.
const char* nccl_result_name(int result);

}  // namespace taiji
