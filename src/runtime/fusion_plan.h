// The pure part of allreduce fusion: what a rank tells the others about its waiting ops,
// and how every rank, from the same lists, settles the same groups in the same order.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace taiji {

// Ops of at most this many bytes travel inside their negotiation entry: once every rank
// listed one, each rank reduces it from the round's data, with no allreduce of its own.
constexpr size_t kFusionInlineBytes = 16;

// One waiting op as the negotiation sees it. Names travel as a 64-bit hash, so that an
// entry has a fixed size whatever the name's length.
struct FusionEntry {
  uint64_t hash = 0;
  uint64_t version = 0;
  uint64_t count = 0;
  uint8_t dtype = 0;
  uint8_t redop = 0;
  // The input, when inline_data(); aligned for the reduce kernels, which read it as the dtype.
  alignas(8) std::array<uint8_t, kFusionInlineBytes> data{};

  uint64_t bytes() const { return count * dtype_size(static_cast<DType>(dtype)); }
  bool inline_data() const { return bytes() <= kFusionInlineBytes; }

  bool same_op(const FusionEntry& o) const { return hash == o.hash && version == o.version; }
  bool same_shape(const FusionEntry& o) const {
    return count == o.count && dtype == o.dtype && redop == o.redop;
  }
};

inline bool operator<(const FusionEntry& a, const FusionEntry& b) {
  return a.hash != b.hash ? a.hash < b.hash : a.version < b.version;
}

constexpr size_t kFusionEntryBytes = 32 + kFusionInlineBytes;

uint64_t fusion_name_hash(const std::string& name);

// Little-endian, one entry per kFusionEntryBytes; unused slots are all zero.
void encode_fusion_entries(const std::vector<FusionEntry>& entries, uint8_t* out, size_t slots);
std::vector<FusionEntry> decode_fusion_entries(const uint8_t* in, size_t slots);

// An op listed by every rank, but with different shapes on two of them.
struct FusionMismatch {
  FusionEntry entry;        // as this rank listed it
  int rank_a = 0;
  FusionEntry shape_a;
  int rank_b = 0;
  FusionEntry shape_b;
};

struct FusionOutcome {
  std::vector<FusionEntry> agreed;          // listed by every rank with one shape, sorted
  std::vector<FusionMismatch> mismatched;
};

// lists[r]: rank r's entries. Only ops every rank listed settle; the rest wait.
FusionOutcome settle_fusion_round(const std::vector<std::vector<FusionEntry>>& lists, int self);

struct FusionGroup {
  DType dtype = DType::F32;
  RedOp redop = RedOp::Sum;
  uint64_t count = 0;                       // elements, all members together
  std::vector<FusionEntry> members;         // in buffer order
};

// An agreed inline op's result: every rank's data combined in rank order (the same bits
// on every rank). `out` holds entry.bytes().
void reduce_inline_entry(const std::vector<std::vector<FusionEntry>>& lists, const FusionEntry& entry,
                         uint8_t* out);

// Groups of one dtype and reduction each, at most buffer_bytes (a single larger op alone);
// inline ops are left out.
std::vector<FusionGroup> plan_fusion_groups(const std::vector<FusionEntry>& agreed,
                                            uint64_t buffer_bytes);

std::string describe_fusion_shape(const FusionEntry& e);

}  // namespace taiji
