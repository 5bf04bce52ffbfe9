#include "collective_reference.h"

#include <algorithm>

#include "common.h"

namespace taiji_test {

size_t elem_size(const Op& op) { return op.coll == Coll::Consensus ? 1 : dtype_size(op.dtype); }

size_t send_elements(const Op& op, int n) {
  switch (op.coll) {
    case Coll::ReduceScatter: return op.count * static_cast<size_t>(n);
    case Coll::Barrier: return 0;
    default: return op.count;
  }
}

size_t recv_elements(const Op& op, int n) {
  switch (op.coll) {
    case Coll::Allgather:
    case Coll::Gather: return op.count * static_cast<size_t>(n);
    case Coll::Consensus:
    case Coll::Barrier: return 0;
    default: return op.count;
  }
}

int32_t input_value(const Op& op, int rank, size_t i) {
  return static_cast<int32_t>(gen64(op.salt, rank, i) % 2001) - 1000;
}

namespace {

void store(taiji_dtype_t dtype, void* buf, size_t i, double v) {
  if (dtype == TAIJI_F32) {
    static_cast<float*>(buf)[i] = static_cast<float>(v);
  } else {
    static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
  }
}

// The serial reference: element `offset + i` of every rank's input, reduced in rank order.
void reduce_reference(const Op& op, int n, size_t offset, void* out) {
  for (size_t i = 0; i < op.count; ++i) {
    int64_t sum = 0;
    int64_t hi = input_value(op, 0, offset + i);
    for (int r = 0; r < n; ++r) {
      int64_t v = input_value(op, r, offset + i);
      sum += v;
      hi = std::max(hi, v);
    }
    if (op.redop == TAIJI_MAX) {
      store(op.dtype, out, i, static_cast<double>(hi));
    } else if (op.redop == TAIJI_SUM) {
      store(op.dtype, out, i, static_cast<double>(sum));
    } else if (op.dtype == TAIJI_F32) {
      static_cast<float*>(out)[i] = static_cast<float>(sum) / static_cast<float>(n);
    } else {
      static_cast<int32_t*>(out)[i] = static_cast<int32_t>(sum / n);
    }
  }
}

}  // namespace

void fill_send(const Op& op, int n, int rank, void* buf) {
  if (op.coll == Coll::Consensus) {
    auto* p = static_cast<uint8_t*>(buf);
    fill_bytes(op.salt, p, op.count);
    if (rank == op.odd_rank && op.count > 0) p[op.salt % op.count] ^= 0x20;
    return;
  }
  const size_t count = send_elements(op, n);
  for (size_t i = 0; i < count; ++i) store(op.dtype, buf, i, input_value(op, rank, i));
}

std::vector<uint8_t> expected_output(const Op& op, int n, int rank) {
  const size_t es = elem_size(op);
  std::vector<uint8_t> out(recv_elements(op, n) * es);
  switch (op.coll) {
    case Coll::Allreduce:
    case Coll::Reduce: reduce_reference(op, n, 0, out.data()); break;
    case Coll::ReduceScatter: reduce_reference(op, n, static_cast<size_t>(rank) * op.count, out.data()); break;
    case Coll::Broadcast:
      for (size_t i = 0; i < op.count; ++i) store(op.dtype, out.data(), i, input_value(op, op.root, i));
      break;
    case Coll::Allgather:
    case Coll::Gather:
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < op.count; ++i) {
          store(op.dtype, out.data(), static_cast<size_t>(q) * op.count + i, input_value(op, q, i));
        }
      }
      break;
    case Coll::Consensus:
    case Coll::Barrier: break;
  }
  return out;
}

}  // namespace taiji_test
