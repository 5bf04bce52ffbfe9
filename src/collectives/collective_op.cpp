#include "collectives/collective_op.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <new>
#include <set>

#include "collectives/reduce_kernels.h"

namespace taiji {

uint64_t chunk_count(uint64_t count, size_t elem, size_t pairs, uint64_t chunk_bytes) {
  uint64_t bytes = count * elem;
  uint64_t n = std::max<uint64_t>(1, (bytes + chunk_bytes - 1) / chunk_bytes);
  if (pairs > 1) n = (n + pairs - 1) / pairs * pairs;
  return std::min<uint64_t>(n, std::max<uint64_t>(count, 1));
}

std::vector<uint64_t> plan_chunks(uint64_t count, size_t elem, size_t pairs,
                                  uint64_t chunk_bytes) {
  const uint64_t n = chunk_count(count, elem, pairs, chunk_bytes);
  std::vector<uint64_t> bounds(n + 1);
  for (uint64_t i = 0; i <= n; ++i) {
    bounds[i] = static_cast<uint64_t>(static_cast<unsigned __int128>(count) * i / n);
  }
  return bounds;
}

uint64_t send_elements(const CollectiveSpec& s) {
  switch (s.kind) {
    case OpKind::Barrier: case OpKind::Recv: return 0;
    case OpKind::ReduceScatter: return s.count * static_cast<uint64_t>(s.size);
    default: return s.count;
  }
}

uint64_t recv_elements(const CollectiveSpec& s) {
  uint64_t n = static_cast<uint64_t>(s.size);
  switch (s.kind) {
    case OpKind::Barrier: case OpKind::Consensus: case OpKind::Send: return 0;
    case OpKind::Reduce: return s.rank == s.root ? s.count : 0;
    case OpKind::Gather: return s.rank == s.root ? s.count * n : 0;
    case OpKind::Allgather: return s.count * n;
    default: return s.count;
  }
}

bool is_clique(const Strategy& s, int n) {
  if (s.pairs.size() != static_cast<size_t>(n)) return false;
  for (int k = 0; k < n; ++k) {
    for (const Graph* g : {&s.pairs[k].reduce, &s.pairs[k].broadcast}) {
      if (g->size() != n) return false;
      for (int r = 0; r < n; ++r) {
        if (g->parent(r) != (r == k ? -1 : k)) return false;
      }
    }
  }
  return true;
}

bool direct_exchange(const CollectiveSpec& s) {
  if (s.kind != OpKind::Allreduce && s.kind != OpKind::Barrier) return false;
  if (s.norms || s.size < 2 || s.size > kDirectMaxPeers || !s.strategy) return false;
  if (s.count * dtype_size(s.dtype) > kDirectMaxBytes) return false;
  return is_clique(*s.strategy, s.size);
}

CollectiveOp::CollectiveOp(CollectiveSpec spec) : spec_(std::move(spec)) {
  elem_ = dtype_size(spec_.dtype);
  try {
    plan();
  } catch (const std::bad_alloc&) {
    // The op's own buffers (up to size x count elements on a gather's non-root) do not
    // fit: no plan, and the engine fails the op instead of the process.
    std::vector<uint8_t>().swap(scratch_);
    std::vector<Chunk>().swap(plan_);
    graphs_.clear();
    sources_.clear();
    destinations_.clear();
    spec_.norms.reset();
    out_of_memory_ = true;
    return;
  }
  // Collected with repeats, then sorted and deduplicated: a set would cost an allocation
  // per rank, and small ops are paid for per allocation.
  for (Chunk& ch : plan_) {
    if (ch.mode == Mode::ReduceBcast || ch.mode == Mode::Reduce) {
      const auto& kids = ch.reduce->children(spec_.rank);
      ch.partials.resize(kids.size());
      ch.arrived.assign(kids.size(), false);
      ch.pending = kids.size();
      sources_.insert(sources_.end(), kids.begin(), kids.end());
      if (ch.reduce->parent(spec_.rank) >= 0) destinations_.push_back(ch.reduce->parent(spec_.rank));
    }
    if (ch.mode == Mode::ReduceBcast || ch.mode == Mode::Bcast) {
      if (ch.bcast->parent(spec_.rank) >= 0) sources_.push_back(ch.bcast->parent(spec_.rank));
      const auto& down = ch.bcast->children(spec_.rank);
      destinations_.insert(destinations_.end(), down.begin(), down.end());
    }
    if (ch.route_from >= 0) sources_.push_back(ch.route_from);
    if (ch.route_to >= 0) destinations_.push_back(ch.route_to);
  }
  for (std::vector<int>* ranks : {&sources_, &destinations_}) {
    std::sort(ranks->begin(), ranks->end());
    ranks->erase(std::unique(ranks->begin(), ranks->end()), ranks->end());
  }
  if (spec_.norms && spec_.kind == OpKind::Allreduce) {
    local_left_ = chunks();
    for (const Chunk& ch : plan_) rooted_left_ += ch.reduce->parent(spec_.rank) < 0 ? 1 : 0;
  } else {
    spec_.norms.reset();
  }
}

void CollectiveOp::plan() {
  // A send or recv has no strategy: the pair exchanges the buffer directly.
  if (op_kind_p2p(spec_.kind)) return plan_pair();
  const Strategy& s = *spec_.strategy;
  const int n = spec_.size;
  const uint64_t block = spec_.count;
  // Rooted graphs are built once per distinct root, and only as many as a block's chunks
  // use (chunk i takes graph i mod the count): a small op on a strategy with many pairs
  // would otherwise reroot every pair for every root. graphs_ keeps pointers valid.
  struct Rooted {
    std::vector<const Graph*> graphs;  // those the chunks use: the first of `count`
    size_t count;                      // graphs the chunks are spread over
  };
  auto rooted = [&](bool broadcast, int root) {
    Rooted out{{}, rooted_graph_count(s, root)};
    const uint64_t used = std::min<uint64_t>(out.count, chunk_count(block, elem_, out.count, spec_.chunk_bytes));
    auto gs = broadcast ? broadcast_graphs(s, root, used) : reduce_graphs(s, root, used);
    for (Graph& g : gs) {
      graphs_.push_back(std::move(g));
      out.graphs.push_back(&graphs_.back());
    }
    return out;
  };
  uint8_t* recv = static_cast<uint8_t*>(spec_.recv);
  switch (spec_.kind) {
    case OpKind::Allreduce:
    case OpKind::Barrier:
    case OpKind::Consensus: {
      if (direct_exchange(spec_)) {
        plan_direct();
        break;
      }
      // The strategy outlives the op (shared_ptr in spec_), so its graphs are used in place.
      std::vector<const Graph*> r;
      std::vector<const Graph*> b;
      for (const GraphPair& p : s.pairs) {
        r.push_back(&p.reduce);
        b.push_back(&p.broadcast);
      }
      if (spec_.kind == OpKind::Consensus) {
        // Min of the bytes and min of their complements: equal everywhere iff min == max.
        scratch_.resize(2 * block);
        work_ = scratch_.data();
        add_chunks(Mode::ReduceBcast, 0, 2 * block, r, b, -1, s.pairs.size());
      } else {
        work_ = recv;
        add_chunks(Mode::ReduceBcast, 0, block, r, b, -1, s.pairs.size());
      }
      break;
    }
    case OpKind::Broadcast: {
      work_ = recv;
      const Rooted g = rooted(true, spec_.root);
      add_chunks(Mode::Bcast, 0, block, {}, g.graphs, -1, g.count);
      break;
    }
    case OpKind::Reduce: {
      if (spec_.rank == spec_.root) {
        work_ = recv;
      } else {
        scratch_.resize(block * elem_);
        work_ = scratch_.data();
      }
      const Rooted g = rooted(false, spec_.root);
      add_chunks(Mode::Reduce, 0, block, g.graphs, {}, -1, g.count);
      break;
    }
    case OpKind::Allgather:
      work_ = recv;
      for (int b = 0; b < n; ++b) {
        const Rooted g = rooted(true, b);
        add_chunks(Mode::Bcast, b * block, block, {}, g.graphs, b, g.count);
      }
      break;
    case OpKind::ReduceScatter:
      scratch_.resize(block * n * elem_);
      work_ = scratch_.data();
      for (int b = 0; b < n; ++b) {
        const Rooted g = rooted(false, b);
        add_chunks(Mode::Reduce, b * block, block, g.graphs, {}, b, g.count);
      }
      break;
    case OpKind::Gather: {
      if (spec_.rank == spec_.root) {
        work_ = recv;
      } else {
        scratch_.resize(block * n * elem_);
        work_ = scratch_.data();
      }
      const Rooted g = rooted(false, spec_.root);
      for (int b = 0; b < n; ++b) add_chunks(Mode::Route, b * block, block, g.graphs, {}, b, g.count);
      break;
    }
    case OpKind::Send:
    case OpKind::Recv:
    case OpKind::None:
      break;
  }
}

void CollectiveOp::plan_pair() {
  // The sender's chunks go from its input as they are (it only reads them); the
  // receiver's arrive straight into its output. Both cut the buffer alike.
  const bool sending = spec_.kind == OpKind::Send;
  work_ = sending ? const_cast<uint8_t*>(static_cast<const uint8_t*>(spec_.send))
                  : static_cast<uint8_t*>(spec_.recv);
  auto bounds = plan_chunks(spec_.count, elem_, 1, spec_.chunk_bytes);
  plan_.reserve(bounds.size() - 1);
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    Chunk ch;
    ch.mode = Mode::Route;
    ch.begin = bounds[i];
    ch.end = bounds[i + 1];
    ch.route_from = sending ? -1 : spec_.peer;
    ch.route_to = sending ? spec_.peer : -1;
    plan_.push_back(std::move(ch));
  }
}

void CollectiveOp::plan_direct() {
  // Block b of the work buffer is rank b's input, broadcast from b down pair b's star.
  direct_ = true;
  const uint64_t block = spec_.count;
  scratch_.resize(block * static_cast<uint64_t>(spec_.size) * elem_);
  work_ = scratch_.data();
  plan_.reserve(static_cast<size_t>(spec_.size));
  std::vector<const Graph*> star(1);
  for (int b = 0; b < spec_.size; ++b) {
    star[0] = &spec_.strategy->pairs[b].broadcast;
    add_chunks(Mode::Bcast, b * block, block, {}, star, b, 1);
  }
}

void CollectiveOp::add_chunks(Mode mode, uint64_t base, uint64_t count,
                              const std::vector<const Graph*>& reduce,
                              const std::vector<const Graph*>& bcast, int origin, size_t graph_count) {
  auto bounds = plan_chunks(count, elem_, graph_count, spec_.chunk_bytes);
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    Chunk ch;
    ch.mode = mode;
    ch.begin = base + bounds[i];
    ch.end = base + bounds[i + 1];
    if (!reduce.empty()) ch.reduce = reduce[i % reduce.size()];
    if (!bcast.empty()) ch.bcast = bcast[i % bcast.size()];
    if (mode == Mode::Route) {
      // The block climbs from its owner to the root; find where this rank sits on that path.
      int prev = -1;
      for (int at = origin; at >= 0; prev = at, at = ch.reduce->parent(at)) {
        if (at == spec_.rank) {
          ch.route_from = prev;
          ch.route_to = ch.reduce->parent(at);
          break;
        }
      }
    }
    plan_.push_back(std::move(ch));
  }
}

uint8_t* CollectiveOp::chunk_ptr(uint32_t c) const { return work_ + plan_[c].begin * elem_; }

const uint8_t* CollectiveOp::chunk_data(uint32_t c) const {
  if (plan_[c].staged) return chunk_ptr(c);
  return static_cast<const uint8_t*>(spec_.send) + plan_[c].begin * elem_;
}

void CollectiveOp::stage_input(uint32_t c) {
  Chunk& ch = plan_[c];
  if (ch.staged) return;
  std::memcpy(chunk_ptr(c), chunk_data(c), chunk_bytes_of(c));
  ch.staged = true;
}

uint64_t CollectiveOp::chunk_bytes_of(uint32_t c) const {
  return (plan_[c].end - plan_[c].begin) * elem_;
}

void CollectiveOp::start(std::vector<ChunkSend>* out) {
  const uint64_t block_bytes = spec_.count * elem_;
  const auto* send = static_cast<const uint8_t*>(spec_.send);
  switch (spec_.kind) {
    case OpKind::Consensus:
      for (uint64_t i = 0; i < spec_.count; ++i) {
        scratch_[i] = send[i];
        scratch_[spec_.count + i] = static_cast<uint8_t>(~send[i]);
      }
      break;
    case OpKind::Allreduce:
      if (direct_) {
        uint8_t* own = work_ + static_cast<uint64_t>(spec_.rank) * block_bytes;
        if (block_bytes > 0) std::memcpy(own, send, block_bytes);
        break;
      }
      [[fallthrough]];
    case OpKind::Reduce:
    case OpKind::ReduceScatter: {
      // The work buffer is as large as the input.
      const uint64_t bytes = send_elements(spec_) * elem_;
      if (bytes == 0 || work_ == send) break;
      const auto s = reinterpret_cast<uintptr_t>(send);
      const auto w = reinterpret_cast<uintptr_t>(work_);
      // A reduce-scatter works in scratch and writes its block to recv in finish(), which
      // may come while a chunk sent straight from the input is still queued: an input that
      // overlaps recv (in place, as MPI_IN_PLACE has it) must not be read from there.
      const auto r = reinterpret_cast<uintptr_t>(spec_.recv);
      const bool into_input = spec_.kind == OpKind::ReduceScatter && block_bytes > 0 &&
                              s < r + block_bytes && r < s + bytes;
      if (spec_.norms || into_input || (s < w + bytes && w < s + bytes)) {
        // The norm tap counts the input as it goes; overlapping buffers must be read
        // before either is written.
        std::memmove(work_, send, bytes);
        break;
      }
      // The input is copied to the work buffer chunk by chunk, only where this rank
      // combines into it or holds the result. A chunk it only passes on (a ring step's
      // first send, a tree's leaf) goes from the input, and in an allreduce later
      // receives the result: at n=2 half the copy is saved.
      for (Chunk& ch : plan_) ch.staged = false;
      break;
    }
    case OpKind::Allgather:
    case OpKind::Gather: {
      uint8_t* own = work_ + static_cast<uint64_t>(spec_.rank) * block_bytes;
      if (block_bytes > 0 && own != send) std::memmove(own, send, block_bytes);
      break;
    }
    default:
      break;
  }
  for (uint32_t c = 0; c < chunks(); ++c) {
    Chunk& ch = plan_[c];
    switch (ch.mode) {
      case Mode::ReduceBcast:
      case Mode::Reduce:
        if (ch.pending == 0) {
          // No children: this rank's input goes on (or is the result) as it is.
          if (spec_.norms) count_local(chunk_norm(c));
          reduced(c, out);
        }
        break;
      case Mode::Bcast:
        if (ch.bcast->parent(spec_.rank) < 0) finalised(c, out);
        break;
      case Mode::Route:
        if (ch.route_from < 0) {
          // The owner sends its block up; ranks off the path have nothing to do.
          if (ch.route_to >= 0) out->push_back({ch.route_to, c, Stage::Reduce, ch.begin, chunk_ptr(c), chunk_bytes_of(c)});
          finalised(c, out);
        }
        break;
    }
  }
}

Status CollectiveOp::target(int src, uint32_t chunk, Stage stage, uint64_t offset,
                            uint64_t bytes, uint8_t** out, const uint8_t* in_memory) {
  auto fail = [&](const std::string& what) {
    return Status{Code::Protocol, "chunk " + std::to_string(chunk) + " from rank " +
                                      std::to_string(src) + ": " + what};
  };
  if (chunk >= chunks()) return fail("past the last chunk " + std::to_string(chunks() - 1));
  Chunk& ch = plan_[chunk];
  if (offset != ch.begin || bytes != chunk_bytes_of(chunk)) {
    return fail("offset/length " + std::to_string(offset) + "/" + std::to_string(bytes) +
                " do not match the chunk plan " + std::to_string(ch.begin) + "/" +
                std::to_string(chunk_bytes_of(chunk)));
  }
  if (stage == Stage::Reduce && ch.mode == Mode::Route) {
    if (src != ch.route_from) return fail("sender is not on this block's path");
    if (ch.from_parent) return fail("duplicate chunk");
    *out = chunk_ptr(chunk);
    return {};
  }
  if (stage == Stage::Reduce) {
    if (ch.reduce == nullptr) return fail("reduce data for a chunk that is only broadcast");
    const auto& kids = ch.reduce->children(spec_.rank);
    auto it = std::find(kids.begin(), kids.end(), src);
    if (it == kids.end()) return fail("sender is not a reduce child of this rank");
    size_t idx = static_cast<size_t>(it - kids.begin());
    if (ch.arrived[idx] || ch.partials[idx].held() || ch.in_memory != nullptr) {
      return fail("duplicate chunk");
    }
    // With one child nothing else is combined in between: the partial can stay where it is
    // (if aligned for the kernels, which read it as the dtype).
    if (in_memory != nullptr && kids.size() == 1 && reinterpret_cast<uintptr_t>(in_memory) % elem_ == 0) {
      ch.in_memory = in_memory;
      *out = nullptr;
      return {};
    }
    ch.partials[idx] = ScratchBuffer(bytes);
    *out = ch.partials[idx].data();
    return {};
  }
  if (ch.bcast == nullptr) return fail("broadcast data for a chunk that is only reduced");
  if (ch.bcast->parent(spec_.rank) != src) return fail("sender is not the broadcast parent");
  if (ch.from_parent) return fail("duplicate chunk");
  *out = chunk_ptr(chunk);
  return {};
}

void CollectiveOp::delivered(int src, uint32_t chunk, Stage stage, std::vector<ChunkSend>* out) {
  Chunk& ch = plan_[chunk];
  if (stage == Stage::Broadcast || ch.mode == Mode::Route) {
    ch.from_parent = true;
    ch.staged = true;  // the result arrived in place of this rank's input
    if (ch.mode == Mode::Route && ch.route_to >= 0) {
      out->push_back({ch.route_to, chunk, Stage::Reduce, ch.begin, chunk_ptr(chunk), chunk_bytes_of(chunk)});
    }
    finalised(chunk, out);
    return;
  }
  const auto& kids = ch.reduce->children(spec_.rank);
  size_t idx = static_cast<size_t>(std::find(kids.begin(), kids.end(), src) - kids.begin());
  ch.arrived[idx] = true;
  if (--ch.pending > 0) return;
  // Children are combined in rank order once all arrived: the result does not depend on
  // arrival timing, so repeated runs are bitwise reproducible.
  uint64_t n = chunk_bytes_of(chunk) / elem_;
  // With norms, the first combine reads this rank's input anyway; the last one, where the
  // reduction ends here and no division follows, writes the result.
  const bool result_here = spec_.norms && ch.reduce->parent(spec_.rank) < 0 && spec_.redop == RedOp::Sum;
  stage_input(chunk);
  double before = 0;
  double after = 0;
  for (size_t k = 0; k < ch.partials.size(); ++k) {
    const bool last = k + 1 == ch.partials.size();
    const uint8_t* partial = ch.in_memory != nullptr ? ch.in_memory : ch.partials[k].data();
    reduce_into_counting(spec_.dtype, spec_.redop, chunk_ptr(chunk), partial, n,
                         spec_.norms && k == 0 ? &before : nullptr, last && result_here ? &after : nullptr);
    ch.partials[k].release();
  }
  ch.in_memory = nullptr;
  if (spec_.norms) {
    count_local(before);
    if (result_here) count_rooted(after);
  }
  reduced(chunk, out);
}

void CollectiveOp::reduced(uint32_t c, std::vector<ChunkSend>* out) {
  const Chunk& ch = plan_[c];
  int parent = ch.reduce->parent(spec_.rank);
  if (parent >= 0) {
    out->push_back({parent, c, Stage::Reduce, ch.begin, chunk_data(c), chunk_bytes_of(c)});
    // A reduction without a broadcast is this rank's part done once its partial is out.
    if (ch.mode == Mode::Reduce) finalised(c, out);
    return;
  }
  stage_input(c);
  if (spec_.redop == RedOp::Avg && spec_.kind != OpKind::Barrier) {
    finish_average(spec_.dtype, chunk_ptr(c), chunk_bytes_of(c) / elem_, spec_.size);
  }
  // The result's norm, unless the last combine already counted it.
  if (spec_.norms && (spec_.redop != RedOp::Sum || ch.reduce->children(spec_.rank).empty())) {
    count_rooted(chunk_norm(c));
  }
  finalised(c, out);
}

double CollectiveOp::chunk_norm(uint32_t c) const {
  return squared_norm(spec_.dtype, chunk_ptr(c), chunk_bytes_of(c) / elem_);
}

void CollectiveOp::count_local(double sum) {
  spec_.norms->local += sum;
  --local_left_;
  if (local_left_ == 0 && rooted_left_ == 0 && spec_.norms->on_counted) {
    spec_.norms->on_counted(spec_.norms->local, spec_.norms->rooted);
  }
}

void CollectiveOp::count_rooted(double sum) {
  spec_.norms->rooted += sum;
  --rooted_left_;
  if (local_left_ == 0 && rooted_left_ == 0 && spec_.norms->on_counted) {
    spec_.norms->on_counted(spec_.norms->local, spec_.norms->rooted);
  }
}

void CollectiveOp::finalised(uint32_t c, std::vector<ChunkSend>* out) {
  Chunk& ch = plan_[c];
  ch.final = true;
  if (ch.bcast != nullptr) {
    for (int child : ch.bcast->children(spec_.rank)) {
      out->push_back({child, c, Stage::Broadcast, ch.begin, chunk_ptr(c), chunk_bytes_of(c)});
    }
  }
  if (++final_chunks_ == chunks()) finish();
}

void CollectiveOp::finish() {
  const uint64_t block_bytes = spec_.count * elem_;
  if (direct_ && spec_.kind == OpKind::Allreduce) {
    // Rank order, as a serial reduction would: every rank computes the same bits.
    std::array<const void*, kDirectMaxPeers> inputs{};
    const size_t n = static_cast<size_t>(spec_.size);
    for (size_t k = 0; k < n; ++k) inputs[k] = work_ + k * block_bytes;
    combine_in_order(spec_.dtype, spec_.redop, spec_.recv, std::span(inputs.data(), n), spec_.count);
  }
  if (spec_.kind == OpKind::ReduceScatter && block_bytes > 0) {
    std::memcpy(spec_.recv, work_ + static_cast<uint64_t>(spec_.rank) * block_bytes, block_bytes);
  }
  if (spec_.kind == OpKind::Consensus && spec_.agree != nullptr) {
    bool same = true;
    for (uint64_t i = 0; i < spec_.count && same; ++i) {
      same = scratch_[i] == static_cast<uint8_t>(~scratch_[spec_.count + i]);
    }
    *spec_.agree = same ? 1 : 0;
  }
}

std::vector<int> CollectiveOp::waiting_on() const {
  std::set<int> ranks;
  for (const Chunk& ch : plan_) {
    if (ch.final) continue;
    if (ch.mode == Mode::Route) {
      if (ch.route_from >= 0) ranks.insert(ch.route_from);
    } else if (ch.pending > 0) {
      const auto& kids = ch.reduce->children(spec_.rank);
      for (size_t i = 0; i < kids.size(); ++i) {
        if (!ch.arrived[i]) ranks.insert(kids[i]);
      }
    } else if (ch.bcast != nullptr && ch.bcast->parent(spec_.rank) >= 0) {
      ranks.insert(ch.bcast->parent(spec_.rank));
    }
  }
  return {ranks.begin(), ranks.end()};
}

}  // namespace taiji
