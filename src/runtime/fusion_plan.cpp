#include "runtime/fusion_plan.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "collectives/reduce_kernels.h"
#include "common/byte_order.h"

namespace taiji {

namespace {

// Byte 24 marks a used slot, so that an all-zero entry never reads as an op.
constexpr size_t kUsedAt = 24;

}  // namespace

uint64_t fusion_name_hash(const std::string& name) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void encode_fusion_entries(const std::vector<FusionEntry>& entries, uint8_t* out, size_t slots) {
  std::fill(out, out + slots * kFusionEntryBytes, uint8_t{0});
  for (size_t i = 0; i < entries.size() && i < slots; ++i) {
    uint8_t* p = out + i * kFusionEntryBytes;
    put64(p, entries[i].hash);
    put64(p + 8, entries[i].version);
    put64(p + 16, entries[i].count);
    p[kUsedAt] = 1;
    p[kUsedAt + 1] = entries[i].dtype;
    p[kUsedAt + 2] = entries[i].redop;
    if (entries[i].inline_data()) std::memcpy(p + 32, entries[i].data.data(), kFusionInlineBytes);
  }
}

std::vector<FusionEntry> decode_fusion_entries(const uint8_t* in, size_t slots) {
  std::vector<FusionEntry> out;
  for (size_t i = 0; i < slots; ++i) {
    const uint8_t* p = in + i * kFusionEntryBytes;
    if (p[kUsedAt] != 1) continue;
    FusionEntry e;
    e.hash = get64(p);
    e.version = get64(p + 8);
    e.count = get64(p + 16);
    e.dtype = p[kUsedAt + 1];
    e.redop = p[kUsedAt + 2];
    std::memcpy(e.data.data(), p + 32, kFusionInlineBytes);
    out.push_back(e);
  }
  return out;
}

FusionOutcome settle_fusion_round(const std::vector<std::vector<FusionEntry>>& lists, int self) {
  FusionOutcome out;
  if (lists.empty()) return out;
  std::vector<std::vector<FusionEntry>> sorted(lists);
  for (auto& l : sorted) std::sort(l.begin(), l.end());
  for (const FusionEntry& e : sorted[0]) {
    bool everywhere = true;
    int differs = -1;
    FusionEntry other;
    FusionEntry mine = e;
    for (size_t r = 0; r < sorted.size(); ++r) {
      auto at = std::lower_bound(sorted[r].begin(), sorted[r].end(), e);
      if (at == sorted[r].end() || !at->same_op(e)) {
        everywhere = false;
        break;
      }
      if (static_cast<int>(r) == self) mine = *at;
      if (differs < 0 && !at->same_shape(e)) {
        differs = static_cast<int>(r);
        other = *at;
      }
    }
    if (!everywhere) continue;
    if (differs < 0) {
      out.agreed.push_back(e);
    } else {
      out.mismatched.push_back({mine, 0, e, differs, other});
    }
  }
  return out;
}

void reduce_inline_entry(const std::vector<std::vector<FusionEntry>>& lists, const FusionEntry& entry,
                         uint8_t* out) {
  // Settled ops are in every list, so there is one input per rank, in rank order.
  std::vector<const void*> inputs;
  for (const auto& list : lists) {
    auto at = std::find_if(list.begin(), list.end(), [&](const FusionEntry& e) { return e.same_op(entry); });
    if (at != list.end()) inputs.push_back(at->data.data());
  }
  combine_in_order(static_cast<DType>(entry.dtype), static_cast<RedOp>(entry.redop), out, inputs,
                   entry.count);
}

std::vector<FusionGroup> plan_fusion_groups(const std::vector<FusionEntry>& agreed,
                                            uint64_t buffer_bytes) {
  // Buckets in (dtype, redop) order, members in agreed order: the same on every rank.
  std::map<std::pair<uint8_t, uint8_t>, std::vector<FusionEntry>> buckets;
  for (const FusionEntry& e : agreed) {
    if (!e.inline_data()) buckets[{e.dtype, e.redop}].push_back(e);
  }
  std::vector<FusionGroup> groups;
  for (auto& [kind, members] : buckets) {
    uint64_t elem = dtype_size(static_cast<DType>(kind.first));
    FusionGroup g;
    g.dtype = static_cast<DType>(kind.first);
    g.redop = static_cast<RedOp>(kind.second);
    for (const FusionEntry& e : members) {
      if (!g.members.empty() && (g.count + e.count) * elem > buffer_bytes) {
        groups.push_back(g);
        g.members.clear();
        g.count = 0;
      }
      g.members.push_back(e);
      g.count += e.count;
    }
    if (!g.members.empty()) groups.push_back(g);
  }
  return groups;
}

std::string describe_fusion_shape(const FusionEntry& e) {
  std::string s = "allreduce count " + std::to_string(e.count) + " ";
  s += valid_dtype(e.dtype) ? dtype_name(static_cast<DType>(e.dtype)) : "dtype?";
  s += " ";
  s += valid_redop(e.redop) ? redop_name(static_cast<RedOp>(e.redop)) : "op?";
  return s;
}

}  // namespace taiji
