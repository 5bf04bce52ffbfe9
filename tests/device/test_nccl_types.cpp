// The mapping of taiji's types, operators and op kinds onto NCCL's, value by value (and
// against nccl.h itself where the build has it), and what NCCL's results mean to taiji.
#include <catch2/catch.hpp>

#include <string>

#include "device/nccl_types.h"

#if TAIJI_HAVE_NCCL
#include <nccl.h>
#endif

using namespace taiji;

namespace {

int dtype_value(DType t) {
  Result<int> r = nccl_dtype(t);
  REQUIRE(r.is_ok());
  return r.value();
}

int redop_value(RedOp o) {
  Result<int> r = nccl_redop(o);
  REQUIRE(r.is_ok());
  return r.value();
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

TEST_CASE("every taiji dtype has its NCCL type", "[device_types]") {
  CHECK(dtype_value(DType::F32) == 7);
  CHECK(dtype_value(DType::F64) == 8);
  CHECK(dtype_value(DType::F16) == 6);
  CHECK(dtype_value(DType::BF16) == 9);
  CHECK(dtype_value(DType::I8) == 0);
  CHECK(dtype_value(DType::U8) == 1);
  CHECK(dtype_value(DType::I32) == 2);
  CHECK(dtype_value(DType::U32) == 3);
  CHECK(dtype_value(DType::I64) == 4);
  CHECK(dtype_value(DType::U64) == 5);
#if TAIJI_HAVE_NCCL
  CHECK(dtype_value(DType::F32) == ncclFloat32);
  CHECK(dtype_value(DType::F64) == ncclFloat64);
  CHECK(dtype_value(DType::F16) == ncclFloat16);
  CHECK(dtype_value(DType::BF16) == ncclBfloat16);
  CHECK(dtype_value(DType::I8) == ncclInt8);
  CHECK(dtype_value(DType::U8) == ncclUint8);
  CHECK(dtype_value(DType::I32) == ncclInt32);
  CHECK(dtype_value(DType::U32) == ncclUint32);
  CHECK(dtype_value(DType::I64) == ncclInt64);
  CHECK(dtype_value(DType::U64) == ncclUint64);
#endif
}

TEST_CASE("every taiji reduction operator has its NCCL operator", "[device_types]") {
  CHECK(redop_value(RedOp::Sum) == 0);
  CHECK(redop_value(RedOp::Prod) == 1);
  CHECK(redop_value(RedOp::Min) == 3);  // NCCL orders max before min
  CHECK(redop_value(RedOp::Max) == 2);
  CHECK(redop_value(RedOp::Avg) == 4);
#if TAIJI_HAVE_NCCL
  CHECK(redop_value(RedOp::Sum) == ncclSum);
  CHECK(redop_value(RedOp::Prod) == ncclProd);
  CHECK(redop_value(RedOp::Min) == ncclMin);
  CHECK(redop_value(RedOp::Max) == ncclMax);
  CHECK(redop_value(RedOp::Avg) == ncclAvg);
#endif
}

TEST_CASE("values off taiji's lists are Unsupported, not a wrong NCCL type", "[device_types]") {
  Result<int> t = nccl_dtype(static_cast<DType>(kDTypeCount));
  REQUIRE_FALSE(t.is_ok());
  CHECK(t.status().code() == Code::Unsupported);
  CHECK(t.status().message() == "element type 10 has no NCCL type");
  Result<int> o = nccl_redop(static_cast<RedOp>(200));
  REQUIRE_FALSE(o.is_ok());
  CHECK(o.status().code() == Code::Unsupported);
  CHECK(o.status().message() == "reduction operator 200 has no NCCL operator");
}

TEST_CASE("the device backend runs the five NCCL collectives and says so for the rest",
          "[device_types]") {
  for (OpKind k : {OpKind::Allreduce, OpKind::Broadcast, OpKind::Reduce, OpKind::Allgather,
                   OpKind::ReduceScatter}) {
    INFO(op_kind_name(k));
    CHECK(device_op_supported(k).is_ok());
  }
  for (OpKind k : {OpKind::None, OpKind::Barrier, OpKind::Gather, OpKind::Consensus,
                   OpKind::Send, OpKind::Recv}) {
    INFO(op_kind_name(k));
    Status s = device_op_supported(k);
    CHECK(s.code() == Code::Unsupported);
    CHECK(starts_with(s.message(),
                      std::string(op_kind_name(k)) + " on device memory is not supported: "));
    CHECK(s.message().find("allreduce, broadcast, reduce, allgather and reduce_scatter") !=
          std::string::npos);
  }
  CHECK(device_op_supported(OpKind::Gather).message() ==
        "gather on device memory is not supported: the device backend (NCCL) runs allreduce, "
        "broadcast, reduce, allgather and reduce_scatter; pass host buffers for the others");
}

TEST_CASE("NCCL's results map onto taiji's codes", "[device_types]") {
  CHECK(nccl_result_code(0) == Code::Ok);
  CHECK(nccl_result_code(1) == Code::Internal);          // unhandled CUDA error
  CHECK(nccl_result_code(2) == Code::Io);                // system error
  CHECK(nccl_result_code(3) == Code::Internal);          // internal error
  CHECK(nccl_result_code(4) == Code::InvalidArgument);   // invalid argument
  CHECK(nccl_result_code(5) == Code::InvalidArgument);   // invalid usage
  CHECK(nccl_result_code(6) == Code::PeerLost);          // remote error
  CHECK(nccl_result_code(7) == Code::InProgress);
  CHECK(nccl_result_code(99) == Code::Internal);
  CHECK(std::string(nccl_result_name(6)) == "ncclRemoteError");
  CHECK(std::string(nccl_result_name(7)) == "ncclInProgress");
  CHECK(std::string(nccl_result_name(-1)) == "unknown ncclResult_t");
#if TAIJI_HAVE_NCCL
  CHECK(nccl_result_code(ncclSystemError) == Code::Io);
  CHECK(nccl_result_code(ncclRemoteError) == Code::PeerLost);
  CHECK(nccl_result_code(ncclInvalidUsage) == Code::InvalidArgument);
  CHECK(nccl_result_code(ncclInProgress) == Code::InProgress);
  CHECK(nccl::kUnhandledCudaError == ncclUnhandledCudaError);
  CHECK(nccl::kInternalError == ncclInternalError);
#endif
}
