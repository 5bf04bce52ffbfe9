// The direct exchange of small allreduces and barriers, driven through CollectiveOp's
// state machine for n ranks in one process (op_sim.h), so the test sees every message
// and every result.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/reduce_kernels.h"
#include "op_sim.h"
#include "topology/selection.h"

using namespace taiji;
using namespace taiji_test;


TEST_CASE("direct exchange: chosen for small allreduces and barriers on a clique only", "[direct]") {
  auto clique = strategy("clique", 4);
  auto star = strategy("star", 4);
  float x[512] = {};
  CHECK(is_clique(*clique, 4));
  CHECK_FALSE(is_clique(*star, 4));
  CHECK_FALSE(is_clique(*strategy("ring", 4), 4));
  CHECK(direct_exchange(spec_for(OpKind::Allreduce, RedOp::Sum, clique, 4, 0, x, x, 256)));
  CHECK(direct_exchange(spec_for(OpKind::Barrier, RedOp::Sum, clique, 4, 0, nullptr, nullptr, 0)));
  CHECK_FALSE(direct_exchange(spec_for(OpKind::Allreduce, RedOp::Sum, clique, 4, 0, x, x, 257)));
  CHECK_FALSE(direct_exchange(spec_for(OpKind::Allreduce, RedOp::Sum, star, 4, 0, x, x, 1)));
  CHECK_FALSE(direct_exchange(spec_for(OpKind::Consensus, RedOp::Min, clique, 4, 0, x, x, 1)));
  CHECK_FALSE(direct_exchange(spec_for(OpKind::Broadcast, RedOp::Sum, clique, 4, 0, x, x, 1)));
  auto tapped = spec_for(OpKind::Allreduce, RedOp::Sum, clique, 4, 0, x, x, 1);
  tapped.norms = std::make_shared<NormTap>();
  CHECK_FALSE(direct_exchange(tapped));
  CHECK_FALSE(direct_exchange(spec_for(OpKind::Allreduce, RedOp::Sum, strategy("clique", 9), 9, 0, x, x, 1)));
  CHECK_FALSE(direct_exchange(spec_for(OpKind::Allreduce, RedOp::Sum, strategy("clique", 1), 1, 0, x, x, 1)));
}

TEST_CASE("direct exchange: the default table picks it for small ops on two peers", "[direct]") {
  CHECK(select_strategy(0, 2, default_selection()) == "clique");
  CHECK(select_strategy(4, 2, default_selection()) == "clique");
  CHECK(select_strategy(kDirectMaxBytes, 2, default_selection()) == "clique");
  CHECK(select_strategy(kDirectMaxBytes + 1, 2, default_selection()) == "tree");
  CHECK(select_strategy(4, 3, default_selection()) == "tree");
  CHECK(select_strategy(0, 8, default_selection()) == "tree");
  CHECK(select_strategy(1 << 20, 2, default_selection()) == "ring");
}

TEST_CASE("direct exchange: one message to every other rank, the rank-order sum everywhere", "[direct]") {
  for (int n = 2; n <= kDirectMaxPeers; ++n) {
    for (uint64_t count : {uint64_t{1}, uint64_t{7}, kDirectMaxBytes / sizeof(float)}) {
      for (RedOp op : {RedOp::Sum, RedOp::Max, RedOp::Avg}) {
        DYNAMIC_SECTION("n=" << n << " count=" << count << " op=" << static_cast<int>(op)) {
          auto in = random_inputs(n, count, static_cast<uint32_t>(n * 1000 + count));
          Run r = run(OpKind::Allreduce, op, strategy("clique", n), n, in, count);
          REQUIRE(r.done);
          for (int k = 0; k < n; ++k) CHECK(r.sent[static_cast<size_t>(k)] == n - 1);
          // The serial reduction in rank order, with the runtime's own kernels.
          std::vector<float> want = in[0];
          for (int k = 1; k < n; ++k) reduce_into(DType::F32, op, want.data(), in[static_cast<size_t>(k)].data(), count);
          if (op == RedOp::Avg) finish_average(DType::F32, want.data(), count, n);
          for (int k = 0; k < n; ++k) {
            CHECK(std::memcmp(r.out[static_cast<size_t>(k)].data(), want.data(), count * sizeof(float)) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("direct exchange: in place, and a barrier", "[direct]") {
  auto clique = strategy("clique", 3);
  SECTION("in place") {
    Run r = run(OpKind::Allreduce, RedOp::Sum, clique, 3, {{1, 2}, {10, 20}, {100, 200}}, 2, true);
    REQUIRE(r.done);
    for (const auto& out : r.out) CHECK(out == std::vector<float>{111, 222});
  }
  SECTION("barrier: done once every rank was heard from, one empty message each way") {
    for (int n = 2; n <= 5; ++n) {
      Run r = run(OpKind::Barrier, RedOp::Sum, strategy("clique", n), n, {}, 0);
      CHECK(r.done);
      for (int k = 0; k < n; ++k) CHECK(r.sent[static_cast<size_t>(k)] == n - 1);
    }
  }
}

TEST_CASE("direct exchange: chunks from the wrong rank or twice are refused", "[direct]") {
  auto clique = strategy("clique", 3);
  float in[2] = {1, 2};
  float out[2] = {};
  CollectiveOp op(spec_for(OpKind::Allreduce, RedOp::Sum, clique, 3, 0, in, out, 2));
  std::vector<ChunkSend> sends;
  op.start(&sends);
  REQUIRE(sends.size() == 2);
  // Chunk 1 is rank 1's block (elements 2-3 of the work buffer); only rank 1 may send it.
  uint8_t* into = nullptr;
  Status wrong = op.target(2, 1, Stage::Broadcast, 2, 8, &into);
  CHECK(wrong.code() == Code::Protocol);
  CHECK(wrong.message().find("not the broadcast parent") != std::string::npos);
  CHECK_FALSE(op.target(1, 1, Stage::Reduce, 2, 8, &into).is_ok());
  CHECK_FALSE(op.target(1, 1, Stage::Broadcast, 0, 8, &into).is_ok());
  REQUIRE(op.target(1, 1, Stage::Broadcast, 2, 8, &into).is_ok());
  op.delivered(1, 1, Stage::Broadcast, &sends);
  Status twice = op.target(1, 1, Stage::Broadcast, 2, 8, &into);
  CHECK(twice.message().find("duplicate chunk") != std::string::npos);
  CHECK_FALSE(op.done());
  CHECK(op.waiting_on() == std::vector<int>{2});
}
