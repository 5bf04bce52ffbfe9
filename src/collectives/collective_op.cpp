#include "collectives/collective_op.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "collectives/reduce_kernels.h"

namespace taiji {

std::vector<uint64_t> plan_chunks(uint64_t count, size_t elem, size_t pairs,
                                  uint64_t chunk_bytes) {
  uint64_t bytes = count * elem;
  uint64_t n = std::max<uint64_t>(1, (bytes + chunk_bytes - 1) / chunk_bytes);
  if (pairs > 1) n = (n + pairs - 1) / pairs * pairs;
  n = std::min<uint64_t>(n, std::max<uint64_t>(count, 1));
  std::vector<uint64_t> bounds(n + 1);
  for (uint64_t i = 0; i <= n; ++i) {
    bounds[i] = static_cast<uint64_t>(static_cast<unsigned __int128>(count) * i / n);
  }
  return bounds;
}

CollectiveOp::CollectiveOp(CollectiveSpec spec) : spec_(std::move(spec)) {
  elem_ = dtype_size(spec_.dtype);
  const auto& pairs = spec_.strategy->pairs;
  size_t graphs = pairs.size();
  if (spec_.kind == OpKind::Broadcast) {
    bcast_graphs_ = broadcast_graphs(*spec_.strategy, spec_.root);
    graphs = bcast_graphs_.size();
  }
  chunk_begin_ = plan_chunks(spec_.count, elem_, graphs, spec_.chunk_bytes);
  chunk_state_.resize(chunks());
  std::set<int> sources;
  std::set<int> destinations;
  for (uint32_t c = 0; c < chunks(); ++c) {
    Chunk& ch = chunk_state_[c];
    if (spec_.kind == OpKind::Broadcast) {
      ch.bcast = &bcast_graphs_[c % graphs];
    } else {
      ch.reduce = &pairs[c % graphs].reduce;
      ch.bcast = &pairs[c % graphs].broadcast;
      const auto& kids = ch.reduce->children(spec_.rank);
      ch.partials.resize(kids.size());
      ch.arrived.assign(kids.size(), false);
      ch.pending = kids.size();
      sources.insert(kids.begin(), kids.end());
      if (ch.reduce->parent(spec_.rank) >= 0) destinations.insert(ch.reduce->parent(spec_.rank));
    }
    int parent = ch.bcast->parent(spec_.rank);
    if (parent >= 0) sources.insert(parent);
    const auto& down = ch.bcast->children(spec_.rank);
    destinations.insert(down.begin(), down.end());
  }
  sources_.assign(sources.begin(), sources.end());
  destinations_.assign(destinations.begin(), destinations.end());
}

uint8_t* CollectiveOp::chunk_ptr(uint32_t c) const {
  return static_cast<uint8_t*>(spec_.recv) + chunk_begin_[c] * elem_;
}

uint64_t CollectiveOp::chunk_bytes_of(uint32_t c) const {
  return (chunk_begin_[c + 1] - chunk_begin_[c]) * elem_;
}

void CollectiveOp::start(std::vector<ChunkSend>* out) {
  if (spec_.kind == OpKind::Broadcast) {
    if (spec_.rank != spec_.root) return;
    for (uint32_t c = 0; c < chunks(); ++c) finalised(c, out);
    return;
  }
  if (spec_.send != spec_.recv && spec_.count > 0) {
    std::memcpy(spec_.recv, spec_.send, spec_.count * elem_);
  }
  for (uint32_t c = 0; c < chunks(); ++c) {
    if (chunk_state_[c].pending == 0) reduced(c, out);
  }
}

Status CollectiveOp::target(int src, uint32_t chunk, Stage stage, uint64_t offset,
                            uint64_t bytes, uint8_t** out) {
  auto fail = [&](const std::string& what) {
    return Status{Code::Protocol, "chunk " + std::to_string(chunk) + " from rank " +
                                      std::to_string(src) + ": " + what};
  };
  if (chunk >= chunks()) return fail("past the last chunk " + std::to_string(chunks() - 1));
  if (offset != chunk_begin_[chunk] || bytes != chunk_bytes_of(chunk)) {
    return fail("offset/length " + std::to_string(offset) + "/" + std::to_string(bytes) +
                " do not match the chunk plan " + std::to_string(chunk_begin_[chunk]) + "/" +
                std::to_string(chunk_bytes_of(chunk)));
  }
  Chunk& ch = chunk_state_[chunk];
  if (stage == Stage::Reduce) {
    if (ch.reduce == nullptr) return fail("reduce data for a broadcast");
    const auto& kids = ch.reduce->children(spec_.rank);
    auto it = std::find(kids.begin(), kids.end(), src);
    if (it == kids.end()) return fail("sender is not a reduce child of this rank");
    size_t idx = static_cast<size_t>(it - kids.begin());
    if (ch.arrived[idx] || !ch.partials[idx].empty()) return fail("duplicate chunk");
    ch.partials[idx].resize(bytes);
    *out = ch.partials[idx].data();
    return {};
  }
  if (ch.bcast->parent(spec_.rank) != src) return fail("sender is not the broadcast parent");
  if (ch.from_parent) return fail("duplicate chunk");
  *out = chunk_ptr(chunk);
  return {};
}

void CollectiveOp::delivered(int src, uint32_t chunk, Stage stage, std::vector<ChunkSend>* out) {
  Chunk& ch = chunk_state_[chunk];
  if (stage == Stage::Broadcast) {
    ch.from_parent = true;
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
  for (auto& partial : ch.partials) {
    if (n > 0) reduce_into(spec_.dtype, spec_.redop, chunk_ptr(chunk), partial.data(), n);
    std::vector<uint8_t>().swap(partial);
  }
  reduced(chunk, out);
}

void CollectiveOp::reduced(uint32_t c, std::vector<ChunkSend>* out) {
  const Chunk& ch = chunk_state_[c];
  int parent = ch.reduce->parent(spec_.rank);
  if (parent >= 0) {
    out->push_back({parent, c, Stage::Reduce, chunk_begin_[c], chunk_ptr(c), chunk_bytes_of(c)});
    return;
  }
  if (spec_.redop == RedOp::Avg && spec_.kind == OpKind::Allreduce) {
    finish_average(spec_.dtype, chunk_ptr(c), chunk_bytes_of(c) / elem_, spec_.size);
  }
  finalised(c, out);
}

void CollectiveOp::finalised(uint32_t c, std::vector<ChunkSend>* out) {
  Chunk& ch = chunk_state_[c];
  ch.final = true;
  ++final_chunks_;
  for (int child : ch.bcast->children(spec_.rank)) {
    out->push_back({child, c, Stage::Broadcast, chunk_begin_[c], chunk_ptr(c), chunk_bytes_of(c)});
  }
}

std::vector<int> CollectiveOp::waiting_on() const {
  std::set<int> ranks;
  for (const Chunk& ch : chunk_state_) {
    if (ch.final) continue;
    if (ch.pending > 0) {
      const auto& kids = ch.reduce->children(spec_.rank);
      for (size_t i = 0; i < kids.size(); ++i) {
        if (!ch.arrived[i]) ranks.insert(kids[i]);
      }
    } else if (ch.bcast->parent(spec_.rank) >= 0) {
      ranks.insert(ch.bcast->parent(spec_.rank));
    }
  }
  return {ranks.begin(), ranks.end()};
}

}  // namespace taiji
