// One collective operation scheduled over a strategy's graphs, as a state machine with
// no I/O of its own: the runtime feeds it arrived chunks and sends what it asks for.
//
// Every collective is a set of chunks over a work buffer; each chunk moves one way:
//  ReduceBcast (allreduce, barrier, consensus): up a reduce graph, where each rank adds
//    its children's partial sums to its own, then down the paired broadcast graph from
//    the root. Every rank ends with the root's bytes: bitwise identical on all peers.
//    Ring: 2(n-1)/n of the buffer per rank, pipelined; tree: ~2 log2(n) hops.
//  Bcast (broadcast, allgather): down a broadcast graph from its root (the owner of the
//    block); allgather runs one such broadcast per rank's block, concurrently.
//  Reduce (reduce, reduce_scatter): up a reduce graph to its root only; reduce_scatter
//    runs one such reduction per block, each ending at the block's owner.
//  Route (gather): a block travels unchanged along the reduce graph's path from its
//    owner to the root; ranks off the path take no part in that chunk.
//  Send and recv: one hop of Route, from the sender straight into the receiver's buffer,
//    with no graph; only the pair takes part.
// Direct exchange (small allreduces and barriers on a clique, see direct_exchange()):
//    every rank's whole input goes straight to every other rank, as in an allgather, and
//    each rank then combines the n inputs in rank order: one hop instead of a tree's
//    two or more, the same bits everywhere.
// Buffers are split into chunks of about chunk_bytes; chunk i of a block runs on graph
// i mod P, so several rooted graphs share the load.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "collectives/scratch_pool.h"
#include "collectives/sum_squares.h"
#include "common/dtype.h"
#include "common/status.h"
#include "topology/graph.h"
#include "transport/frame.h"

namespace taiji {

struct CollectiveSpec {
  OpKind kind = OpKind::Allreduce;
  DType dtype = DType::F32;
  RedOp redop = RedOp::Sum;
  // Elements: of the whole buffer (allreduce, broadcast, reduce, consensus bytes) or of
  // one rank's block (allgather, gather, reduce_scatter).
  uint64_t count = 0;
  int root = 0;                       // broadcast, reduce, gather
  int peer = -1;                      // send: the receiver; recv: the sender
  const void* send = nullptr;         // input (may equal recv where in-place is allowed)
  void* recv = nullptr;               // output (broadcast: the buffer)
  int* agree = nullptr;               // consensus: 1 if every peer held the same bytes
  int rank = 0;
  int size = 1;
  std::shared_ptr<const Strategy> strategy;
  uint8_t strategy_id = 0;            // travel in frames so peers can check agreement
  uint16_t strategy_tag = 0;
  uint64_t chunk_bytes = 1 << 20;
  // Allreduce of a float dtype: sums of squares taken on the way (or none).
  std::shared_ptr<NormTap> norms;
};

struct ChunkSend {
  int dst;
  uint32_t chunk;
  Stage stage;
  uint64_t offset;                    // in elements of the work buffer
  const uint8_t* data;
  uint64_t bytes;
};

class CollectiveOp {
 public:
  explicit CollectiveOp(CollectiveSpec spec);

  const CollectiveSpec& spec() const { return spec_; }
  uint32_t chunks() const { return static_cast<uint32_t>(plan_.size()); }
  // Ranks that send data to this one during the op (ascending, no duplicates).
  const std::vector<int>& sources() const { return sources_; }
  // Ranks this one sends data to during the op (ascending, no duplicates).
  const std::vector<int>& destinations() const { return destinations_; }

  // Starts the op and appends the sends that can go at once.
  void start(std::vector<ChunkSend>* out);
  // Where the payload of one arriving chunk goes. Errors name what was unexpected.
  // in_memory: the payload, if it is already readable there until delivered() returns
  // (shared memory). A reduce stage with a single child then combines straight from it
  // and sets *out to nullptr: nothing needs to be copied.
  Status target(int src, uint32_t chunk, Stage stage, uint64_t offset, uint64_t bytes,
                uint8_t** out, const uint8_t* in_memory = nullptr);
  // The payload returned by target() has fully arrived; appends the sends it enables.
  void delivered(int src, uint32_t chunk, Stage stage, std::vector<ChunkSend>* out);

  bool done() const { return final_chunks_ == chunks(); }
  // The op's buffers could not be allocated: it has no plan and must fail.
  bool out_of_memory() const { return out_of_memory_; }
  // Graphs this op rerooted or copied for its roots (tests bound it).
  size_t rooted_graphs() const { return graphs_.size(); }
  // Ranks whose data this op still waits for (for timeout and stall messages).
  std::vector<int> waiting_on() const;

 private:
  enum class Mode : uint8_t { ReduceBcast, Bcast, Reduce, Route };
  struct Chunk {
    Mode mode = Mode::ReduceBcast;
    uint64_t begin = 0;                // elements of the work buffer
    uint64_t end = 0;
    const Graph* reduce = nullptr;
    const Graph* bcast = nullptr;
    // Reduce stages: one partial per reduce child, combined in child order.
    std::vector<ScratchBuffer> partials;
    const uint8_t* in_memory = nullptr;  // the only child's partial, read in place
    // The work buffer holds this rank's data for the chunk (else it is still in send).
    bool staged = true;
    std::vector<bool> arrived;
    size_t pending = 0;
    // Route: the neighbour this rank receives the block from and forwards it to.
    int route_from = -1;
    int route_to = -1;
    bool from_parent = false;
    bool final = false;
  };

  void plan();
  void plan_direct();
  void plan_pair();
  // Chunks of [base, base + count) spread over graph_count graphs (plan_chunks); chunk i
  // takes graph i mod the count, from lists that may hold only the graphs in use.
  void add_chunks(Mode mode, uint64_t base, uint64_t count, const std::vector<const Graph*>& reduce,
                  const std::vector<const Graph*>& bcast, int origin, size_t graph_count);
  uint8_t* chunk_ptr(uint32_t c) const;
  // This rank's data for chunk c: in the work buffer once staged, else the input.
  const uint8_t* chunk_data(uint32_t c) const;
  void stage_input(uint32_t c);
  uint64_t chunk_bytes_of(uint32_t c) const;
  void reduced(uint32_t c, std::vector<ChunkSend>* out);
  void finalised(uint32_t c, std::vector<ChunkSend>* out);
  void finish();
  // The norm tap: chunk c's share of this rank's input (read now, its only read) or of the
  // result (the chunk's reduction ended here).
  void count_local(double sum);
  void count_rooted(double sum);
  double chunk_norm(uint32_t c) const;

  CollectiveSpec spec_;
  size_t elem_ = 1;
  uint8_t* work_ = nullptr;            // where chunks live: recv, or scratch_
  std::vector<uint8_t> scratch_;
  std::deque<Graph> graphs_;           // rerooted graphs for rooted kinds (stable addresses)
  std::vector<Chunk> plan_;
  std::vector<int> sources_;
  std::vector<int> destinations_;
  uint32_t final_chunks_ = 0;
  bool direct_ = false;                // direct exchange: work_ holds every rank's input
  bool out_of_memory_ = false;
  uint32_t local_left_ = 0;            // norm tap: chunks whose input is not counted yet
  uint32_t rooted_left_ = 0;           // and chunks rooted here whose result is not
};

// How many chunks `count` elements of `elem` bytes make over `pairs` graph pairs: about
// chunk_bytes each, a multiple of `pairs` when there are enough elements, and at least one
// (possibly empty) chunk.
uint64_t chunk_count(uint64_t count, size_t elem, size_t pairs, uint64_t chunk_bytes);
// Those chunks' boundaries (element offsets, chunk_count + 1 entries).
std::vector<uint64_t> plan_chunks(uint64_t count, size_t elem, size_t pairs,
                                  uint64_t chunk_bytes);

// Whether an op runs as a direct exchange: an allreduce (without a norm tap) or barrier
// of at most kDirectMaxBytes on 2..kDirectMaxPeers ranks whose strategy is a clique (pair
// k: stars rooted at k). Decided from the graphs, not the strategy's name, so peers that
// agree on the digest agree on this too. Each rank sends (n-1) times its input, which is
// why this is kept to small inputs and worlds.
constexpr uint64_t kDirectMaxBytes = 1024;
constexpr int kDirectMaxPeers = 8;
bool direct_exchange(const CollectiveSpec& spec);
bool is_clique(const Strategy& s, int n);

// Elements of the send and receive buffers a rank passes for a spec (receive: 0 where
// the op writes nothing on this rank).
uint64_t send_elements(const CollectiveSpec& spec);
uint64_t recv_elements(const CollectiveSpec& spec);

}  // namespace taiji
