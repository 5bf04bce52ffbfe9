// The collective family's ops as the multi-peer tests plan them, and their serial
// reference: what every rank sends and what each must hold afterwards. Compiled into the
// harness library, which keeps the build's optimization (test programs do not): the
// reference runs over every element of every op.
#pragma once

#include <taiji/taiji.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace taiji_test {

enum class Coll { Allreduce, Broadcast, Allgather, Reduce, Gather, ReduceScatter, Consensus, Barrier };

struct Op {
  std::string name;
  Coll coll = Coll::Allreduce;
  taiji_dtype_t dtype = TAIJI_I32;  // I32 or F32
  taiji_reduce_op_t redop = TAIJI_SUM;
  // Elements of the whole buffer (allreduce, broadcast, reduce), of one rank's block
  // (allgather, gather, reduce_scatter), or bytes (consensus).
  size_t count = 0;
  int root = 0;
  bool in_place = false;
  const char* topology = nullptr;  // nullptr: the peer's automatic choice
  uint64_t salt = 0;
  int odd_rank = -1;  // consensus: the rank whose bytes differ; -1: all equal
  // Digest of the expected output, per rank where it differs by rank (reduce_scatter),
  // else one entry; unused for ops without an output.
  std::vector<uint64_t> want;
};

size_t elem_size(const Op& op);
// Elements of rank's send and receive buffers.
size_t send_elements(const Op& op, int n);
size_t recv_elements(const Op& op, int n);
// Element i of rank's send buffer: an integer in [-1000, 1000].
int32_t input_value(const Op& op, int rank, size_t i);
// Rank's input: the values above as the op's dtype (consensus: bytes, one rank's differing).
void fill_send(const Op& op, int n, int rank, void* buf);
// What rank's output buffer must hold after the op (empty for ops without one).
std::vector<uint8_t> expected_output(const Op& op, int n, int rank);

}  // namespace taiji_test
