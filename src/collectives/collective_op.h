// One collective operation scheduled over a strategy's graphs, as a state machine with
// no I/O of its own: the runtime feeds it arrived chunks and sends what it asks for.
//
// The buffer is cut into chunks; chunk c runs on graph pair c mod P.
//  allreduce: on each chunk, a rank waits for the partial sums of its reduce-graph
//    children, adds its own, and passes the result to its parent; the root (after the
//    Avg division) has the final chunk and sends it down the broadcast graph. Every rank
//    ends with the root's bytes, so results are bitwise identical on all peers.
//    Cost per rank: ring 2(n-1)/n of the buffer in ~2(n-1) pipelined steps;
//    tree ~2 log2(n) steps of the whole buffer.
//  broadcast: the broadcast graphs renamed to start at the root; chunks pipeline down.
//  barrier: an allreduce of nothing: one empty chunk up the tree and down again.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "topology/graph.h"
#include "transport/frame.h"

namespace taiji {

struct CollectiveSpec {
  OpKind kind = OpKind::Allreduce;
  DType dtype = DType::F32;
  RedOp redop = RedOp::Sum;
  uint64_t count = 0;
  int root = 0;                       // broadcast only
  const void* send = nullptr;         // allreduce input (may equal recv)
  void* recv = nullptr;               // allreduce output; broadcast buffer
  int rank = 0;
  int size = 1;
  std::shared_ptr<const Strategy> strategy;
  uint8_t strategy_id = 0;            // travels in frames so peers can check agreement
  uint64_t chunk_bytes = 1 << 20;
};

struct ChunkSend {
  int dst;
  uint32_t chunk;
  Stage stage;
  uint64_t offset;                    // in elements
  const uint8_t* data;
  uint64_t bytes;
};

class CollectiveOp {
 public:
  explicit CollectiveOp(CollectiveSpec spec);

  const CollectiveSpec& spec() const { return spec_; }
  uint32_t chunks() const { return static_cast<uint32_t>(chunk_begin_.size() - 1); }
  // Ranks that send data to this one during the op (ascending, no duplicates).
  const std::vector<int>& sources() const { return sources_; }
  // Ranks this one sends data to during the op (ascending, no duplicates).
  const std::vector<int>& destinations() const { return destinations_; }

  // Starts the op and appends the sends that can go at once.
  void start(std::vector<ChunkSend>* out);
  // Where the payload of one arriving chunk goes. Errors name what was unexpected.
  Status target(int src, uint32_t chunk, Stage stage, uint64_t offset, uint64_t bytes,
                uint8_t** out);
  // The payload returned by target() has fully arrived; appends the sends it enables.
  void delivered(int src, uint32_t chunk, Stage stage, std::vector<ChunkSend>* out);

  bool done() const { return final_chunks_ == chunks(); }
  // Ranks whose data this op still waits for (for timeout and stall messages).
  std::vector<int> waiting_on() const;

 private:
  struct Chunk {
    const Graph* reduce = nullptr;     // null for broadcast
    const Graph* bcast = nullptr;
    std::vector<std::vector<uint8_t>> partials;  // one per reduce child, in child order
    std::vector<bool> arrived;
    size_t pending = 0;
    bool from_parent = false;          // broadcast data arrived
    bool final = false;
  };

  uint8_t* chunk_ptr(uint32_t c) const;
  uint64_t chunk_bytes_of(uint32_t c) const;
  void reduced(uint32_t c, std::vector<ChunkSend>* out);
  void finalised(uint32_t c, std::vector<ChunkSend>* out);

  CollectiveSpec spec_;
  size_t elem_ = 1;
  std::vector<uint64_t> chunk_begin_;  // element offsets, chunks()+1 entries
  std::vector<Graph> bcast_graphs_;    // broadcast only: renamed to the root
  std::vector<Chunk> chunk_state_;
  std::vector<int> sources_;
  std::vector<int> destinations_;
  uint32_t final_chunks_ = 0;
};

// Chunk boundaries (element offsets, n+1 entries) for `count` elements of `elem` bytes
// over `pairs` graph pairs: about chunk_bytes each, a multiple of `pairs` when there are
// enough elements, and at least one (possibly empty) chunk.
std::vector<uint64_t> plan_chunks(uint64_t count, size_t elem, size_t pairs,
                                  uint64_t chunk_bytes);

}  // namespace taiji
