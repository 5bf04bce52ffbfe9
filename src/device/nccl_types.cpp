#include "device/nccl_types.h"

#include <string>

#if TAIJI_HAVE_NCCL
#include <nccl.h>

// The ints of nccl_types.h are what the loaded library takes: a header that renumbered
// them would fail here rather than reduce the wrong type at run time.
static_assert(taiji::nccl::kInt8 == ncclInt8 && taiji::nccl::kUint8 == ncclUint8 &&
              taiji::nccl::kInt32 == ncclInt32 && taiji::nccl::kUint32 == ncclUint32 &&
              taiji::nccl::kInt64 == ncclInt64 && taiji::nccl::kUint64 == ncclUint64 &&
              taiji::nccl::kFloat16 == ncclFloat16 && taiji::nccl::kFloat32 == ncclFloat32 &&
              taiji::nccl::kFloat64 == ncclFloat64 && taiji::nccl::kBfloat16 == ncclBfloat16);
static_assert(taiji::nccl::kSum == ncclSum && taiji::nccl::kProd == ncclProd &&
              taiji::nccl::kMax == ncclMax && taiji::nccl::kMin == ncclMin &&
              taiji::nccl::kAvg == ncclAvg);
static_assert(taiji::nccl::kSuccess == ncclSuccess &&
              taiji::nccl::kUnhandledCudaError == ncclUnhandledCudaError &&
              taiji::nccl::kSystemError == ncclSystemError &&
              taiji::nccl::kInternalError == ncclInternalError &&
              taiji::nccl::kInvalidArgument == ncclInvalidArgument &&
              taiji::nccl::kInvalidUsage == ncclInvalidUsage &&
              taiji::nccl::kRemoteError == ncclRemoteError &&
              taiji::nccl::kInProgress == ncclInProgress);
#endif

namespace taiji {

Result<int> nccl_dtype(DType t) {
  switch (t) {
    case DType::F32: return nccl::kFloat32;
    case DType::F64: return nccl::kFloat64;
    case DType::F16: return nccl::kFloat16;
    case DType::BF16: return nccl::kBfloat16;
    case DType::I8: return nccl::kInt8;
    case DType::U8: return nccl::kUint8;
    case DType::I32: return nccl::kInt32;
    case DType::U32: return nccl::kUint32;
    case DType::I64: return nccl::kInt64;
    case DType::U64: return nccl::kUint64;
  }
  return Status(Code::Unsupported,
                "element type " + std::to_string(static_cast<int>(t)) + " has no NCCL type");
}

Result<int> nccl_redop(RedOp o) {
  switch (o) {
    case RedOp::Sum: return nccl::kSum;
    case RedOp::Prod: return nccl::kProd;
    case RedOp::Min: return nccl::kMin;
    case RedOp::Max: return nccl::kMax;
    case RedOp::Avg: return nccl::kAvg;
  }
  return Status(Code::Unsupported, "reduction operator " + std::to_string(static_cast<int>(o)) +
                                       " has no NCCL operator");
}

Status device_op_supported(OpKind k) {
  switch (k) {
    case OpKind::Allreduce:
    case OpKind::Broadcast:
    case OpKind::Reduce:
    case OpKind::Allgather:
    case OpKind::ReduceScatter:
      return Status::ok();
    default:
      break;
  }
  return Status(Code::Unsupported,
                std::string(op_kind_name(k)) +
                    " on device memory is not supported: the device backend (NCCL) runs "
                    "allreduce, broadcast, reduce, allgather and reduce_scatter; pass host "
                    "buffers for the others");
}

Code nccl_result_code(int result) {
  switch (result) {
    case nccl::kSuccess: return Code::Ok;
    case nccl::kInProgress: return Code::InProgress;
    case nccl::kInvalidArgument:
    case nccl::kInvalidUsage: return Code::InvalidArgument;
    case nccl::kSystemError: return Code::Io;
    case nccl::kRemoteError: return Code::PeerLost;
    default: return Code::Internal;
  }
}

const char* nccl_result_name(int result) {
  switch (result) {
    case nccl::kSuccess: return "ncclSuccess";
    case nccl::kUnhandledCudaError: return "ncclUnhandledCudaError";
    case nccl::kSystemError: return "ncclSystemError";
    case nccl::kInternalError: return "ncclInternalError";
    case nccl::kInvalidArgument: return "ncclInvalidArgument";
    case nccl::kInvalidUsage: return "ncclInvalidUsage";
    case nccl::kRemoteError: return "ncclRemoteError";
    case nccl::kInProgress: return "ncclInProgress";
    default: return "unknown ncclResult_t";
  }
}

}  // namespace taiji
