#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/fusion_plan.h"

using namespace taiji;

namespace {

FusionEntry entry(const char* name, uint64_t count, DType dtype = DType::F32, RedOp op = RedOp::Sum,
                  uint64_t version = 1) {
  return {fusion_name_hash(name), version, count, static_cast<uint8_t>(dtype), static_cast<uint8_t>(op)};
}

}  // namespace

TEST_CASE("fusion plan: entries survive encoding; unused slots decode to nothing", "[fusionplan]") {
  std::vector<FusionEntry> in = {entry("a", 7), entry("b", 1ull << 40, DType::BF16, RedOp::Max, 9)};
  std::vector<uint8_t> buf(4 * kFusionEntryBytes, 0xAB);
  encode_fusion_entries(in, buf.data(), 4);
  auto out = decode_fusion_entries(buf.data(), 4);
  REQUIRE(out.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(out[i].same_op(in[i]));
    CHECK(out[i].same_shape(in[i]));
  }
  CHECK(decode_fusion_entries(std::vector<uint8_t>(kFusionEntryBytes, 0).data(), 1).empty());
}

TEST_CASE("fusion plan: only ops every rank listed settle, whatever each list's order", "[fusionplan]") {
  std::vector<std::vector<FusionEntry>> lists = {
      {entry("x", 4), entry("y", 8), entry("only0", 1)},
      {entry("y", 8), entry("x", 4)},
      {entry("z", 2), entry("x", 4), entry("y", 8)},
  };
  auto a = settle_fusion_round(lists, 0);
  std::reverse(lists[0].begin(), lists[0].end());
  auto b = settle_fusion_round(lists, 2);
  REQUIRE(a.agreed.size() == 2);
  REQUIRE(b.agreed.size() == 2);
  for (size_t i = 0; i < 2; ++i) CHECK(a.agreed[i].same_op(b.agreed[i]));
  CHECK(a.mismatched.empty());
}

TEST_CASE("fusion plan: a shape disagreement names both ranks, seen from each", "[fusionplan]") {
  std::vector<std::vector<FusionEntry>> lists = {
      {entry("w", 4)}, {entry("w", 4)}, {entry("w", 4, DType::I32)}};
  for (int self = 0; self < 3; ++self) {
    auto out = settle_fusion_round(lists, self);
    CHECK(out.agreed.empty());
    REQUIRE(out.mismatched.size() == 1);
    const FusionMismatch& m = out.mismatched[0];
    CHECK(m.rank_a == 0);
    CHECK(m.rank_b == 2);
    CHECK(m.shape_b.dtype == static_cast<uint8_t>(DType::I32));
    CHECK(m.entry.same_shape(lists[static_cast<size_t>(self)][0]));
  }
}

TEST_CASE("fusion plan: groups hold one dtype and op each and respect the buffer size", "[fusionplan]") {
  std::vector<FusionEntry> agreed = {
      entry("a", 100), entry("b", 100, DType::F64), entry("c", 100), entry("d", 100, DType::F32, RedOp::Max),
      entry("e", 100), entry("big", 1000)};
  std::sort(agreed.begin(), agreed.end());
  auto groups = plan_fusion_groups(agreed, 1200);  // 300 f32 fit
  uint64_t members = 0;
  for (const FusionGroup& g : groups) {
    uint64_t count = 0;
    for (const FusionEntry& e : g.members) {
      CHECK(e.dtype == static_cast<uint8_t>(g.dtype));
      CHECK(e.redop == static_cast<uint8_t>(g.redop));
      count += e.count;
    }
    CHECK(g.count == count);
    // A single op larger than the buffer goes alone.
    CHECK((g.members.size() == 1 || g.count * dtype_size(g.dtype) <= 1200));
    members += g.members.size();
  }
  CHECK(members == agreed.size());
  auto again = plan_fusion_groups(agreed, 1200);
  REQUIRE(again.size() == groups.size());
  for (size_t i = 0; i < groups.size(); ++i) CHECK(again[i].count == groups[i].count);
}

TEST_CASE("fusion plan: tiny ops reduce from the lists' own data, in rank order", "[fusionplan]") {
  std::vector<std::vector<FusionEntry>> lists(3);
  for (int r = 0; r < 3; ++r) {
    FusionEntry e = entry("t", 2, DType::I32, RedOp::Avg);
    int32_t v[2] = {10 * (r + 1), -(r + 1)};
    std::memcpy(e.data.data(), v, sizeof(v));
    lists[static_cast<size_t>(r)].push_back(e);
  }
  auto out = settle_fusion_round(lists, 1);
  REQUIRE(out.agreed.size() == 1);
  REQUIRE(out.agreed[0].inline_data());
  int32_t got[2] = {0, 0};
  reduce_inline_entry(lists, out.agreed[0], reinterpret_cast<uint8_t*>(got));
  CHECK(got[0] == 20);
  CHECK(got[1] == -2);
  // Inline ops take no buffer; larger ones do.
  CHECK(plan_fusion_groups(out.agreed, 1 << 20).empty());
  CHECK_FALSE(entry("u", 5).inline_data());
}
