// Where a chunk's data is read from. Payloads read where they lie (a shared-memory ring)
// instead of being copied in first: a reduce stage with a single child combines straight
// from them. An out-of-place allreduce sends the chunks it only passes on straight from
// its input. Either way the results must be bitwise those of the copying path.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "op_sim.h"

using namespace taiji;
using namespace taiji_test;

TEST_CASE("in-memory receive: results are bitwise those of copying, on every strategy", "[sources]") {
  struct Setup {
    const char* strategy;
    int n;
    bool single_child_reduces;  // some rank reduces a chunk from exactly one child
  };
  const Setup setups[] = {{"ring", 2, true},  {"ring", 3, true},         {"ring", 5, true},
                          {"tree", 4, true},  {"binary_tree", 6, true},  {"star", 3, false},
                          {"clique", 4, false}};
  // More than one 64 KiB chunk per rank's block on every setup (blocks of 91 KiB and up).
  const uint64_t count = 140001;
  const uint64_t chunk = 64 << 10;
  for (const Setup& setup : setups) {
    auto s = strategy(setup.strategy, setup.n);
    const auto in = random_inputs(setup.n, count, 17u + static_cast<uint32_t>(setup.n));
    for (RedOp op : {RedOp::Sum, RedOp::Max, RedOp::Avg}) {
      INFO(setup.strategy << " n=" << setup.n << " op " << static_cast<int>(op));
      Run copied = run(OpKind::Allreduce, op, s, setup.n, in, count, false, Receive::Copy, chunk);
      Run read = run(OpKind::Allreduce, op, s, setup.n, in, count, false, Receive::InMemory, chunk);
      REQUIRE(copied.done);
      REQUIRE(read.done);
      CHECK(copied.read_in_memory == 0);
      CHECK((read.read_in_memory > 0) == setup.single_child_reduces);
      CHECK(read.sent == copied.sent);
      for (int r = 0; r < setup.n; ++r) {
        const auto& a = copied.out[static_cast<size_t>(r)];
        const auto& b = read.out[static_cast<size_t>(r)];
        CHECK(std::memcmp(a.data(), b.data(), count * sizeof(float)) == 0);
        CHECK(std::memcmp(b.data(), read.out[0].data(), count * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("in-memory receive: a duplicate is refused and a misaligned payload is copied", "[sources]") {
  auto s = strategy("ring", 2);
  std::vector<float> in0(1000, 1.0f), in1(1000, 2.0f), out0(1000), out1(1000);
  // 1 KiB chunks: rank 0 reduces two of the four.
  CollectiveSpec spec0 = spec_for(OpKind::Allreduce, RedOp::Sum, s, 2, 0, in0.data(), out0.data(), 1000);
  CollectiveSpec spec1 = spec_for(OpKind::Allreduce, RedOp::Sum, s, 2, 1, in1.data(), out1.data(), 1000);
  spec0.chunk_bytes = spec1.chunk_bytes = 1024;
  CollectiveOp op0(spec0);
  CollectiveOp op1(spec1);
  std::vector<ChunkSend> sends0, sends1;
  op0.start(&sends0);
  op1.start(&sends1);
  // Rank 1's reduce sends to rank 0, one per chunk rank 0 reduces.
  std::vector<ChunkSend> to0;
  for (const ChunkSend& c : sends1) {
    if (c.dst == 0 && c.stage == Stage::Reduce) to0.push_back(c);
  }
  REQUIRE(to0.size() == 2);
  const ChunkSend& c = to0[0];
  std::vector<uint8_t> payload(c.bytes);
  std::memcpy(payload.data(), c.data, c.bytes);
  uint8_t* into = nullptr;
  REQUIRE(op0.target(1, c.chunk, c.stage, c.offset, c.bytes, &into, payload.data()).is_ok());
  CHECK(into == nullptr);
  Status twice = op0.target(1, c.chunk, c.stage, c.offset, c.bytes, &into, payload.data());
  CHECK_THAT(twice.message(), Catch::Contains("duplicate chunk"));
  std::vector<ChunkSend> after;
  op0.delivered(1, c.chunk, c.stage, &after);
  // Not aligned for f32: copied into a buffer of the op's own.
  const ChunkSend& d = to0[1];
  std::vector<uint8_t> shifted(d.bytes + 1);
  std::memcpy(shifted.data() + 1, d.data, d.bytes);
  REQUIRE(op0.target(1, d.chunk, d.stage, d.offset, d.bytes, &into, shifted.data() + 1).is_ok());
  CHECK(into != nullptr);
}

// Out of place, an allreduce copies its input only where it combines into it; the chunks
// it passes on go straight from the input. The input must stay as it was, and buffers that
// partly overlap (read before either is written) must give the same result.
TEST_CASE("allreduce input: left untouched, and overlapping buffers still reduce right", "[sources]") {
  const uint64_t count = 700001;  // several 1 MiB chunks
  for (const char* name : {"ring", "tree", "binary_tree"}) {
    const int n = 4;
    INFO(name);
    auto s = strategy(name, n);
    auto in = random_inputs(n, count, 5);
    const auto kept = in;
    Run want = run(OpKind::Allreduce, RedOp::Sum, s, n, in, count, true);
    Run out_of_place = run(OpKind::Allreduce, RedOp::Sum, s, n, in, count);
    CHECK(in == kept);
    // Rank k's output starts k * 1000 elements into its input (k = 0: the same buffer).
    std::vector<std::vector<float>> shared(static_cast<size_t>(n));
    std::vector<std::unique_ptr<CollectiveOp>> ops;
    for (int k = 0; k < n; ++k) {
      auto& buf = shared[static_cast<size_t>(k)];
      buf.assign(count + 4000, -1.0f);
      std::copy(in[static_cast<size_t>(k)].begin(), in[static_cast<size_t>(k)].end(), buf.begin());
      ops.push_back(std::make_unique<CollectiveOp>(
          spec_for(OpKind::Allreduce, RedOp::Sum, s, n, k, buf.data(), buf.data() + 1000 * k, count)));
    }
    Run overlapped;
    drive(ops, overlapped);
    REQUIRE(want.done);
    REQUIRE(out_of_place.done);
    REQUIRE(overlapped.done);
    for (int k = 0; k < n; ++k) {
      const float* got = shared[static_cast<size_t>(k)].data() + 1000 * k;
      CHECK(out_of_place.out[static_cast<size_t>(k)] == want.out[static_cast<size_t>(k)]);
      CHECK(std::memcmp(got, want.out[static_cast<size_t>(k)].data(), count * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("rooted ops build only the graphs their chunks use", "[sources]") {
  // 64 pairs, each the tree rooted at 0: every other root reroots them. A small allgather
  // has 3 chunks per block, so it needs 3 graphs per root, not 64; a broadcast of more
  // chunks than pairs uses all 64. Results as the serial reference either way.
  const int n = 8;
  auto many = std::make_shared<Strategy>();
  for (int k = 0; k < 64; ++k) many->pairs.push_back(make_tree(n).pairs[0]);
  std::shared_ptr<const Strategy> s = many;
  for (uint64_t count : {uint64_t{3}, uint64_t{5000}}) {
    const bool gather = count == 3;
    INFO((gather ? "allgather" : "broadcast") << " of " << count);
    auto in = random_inputs(n, count, 5);
    Run r;
    const uint64_t out_count = gather ? count * n : count;
    r.out.assign(n, std::vector<float>(out_count, -1.0f));
    if (!gather) r.out[5] = in[5];
    std::vector<std::unique_ptr<CollectiveOp>> ops;
    for (int k = 0; k < n; ++k) {
      CollectiveSpec spec = spec_for(gather ? OpKind::Allgather : OpKind::Broadcast, RedOp::Sum, s, n, k,
                                     gather ? in[static_cast<size_t>(k)].data() : r.out[static_cast<size_t>(k)].data(),
                                     r.out[static_cast<size_t>(k)].data(), count);
      spec.root = 5;
      spec.chunk_bytes = 256;  // 5000 floats: 79 chunks, rounded up to 128 over 64 pairs
      ops.push_back(std::make_unique<CollectiveOp>(spec));
    }
    drive(ops, r);
    REQUIRE(r.done);
    for (int k = 0; k < n; ++k) {
      CHECK(ops[static_cast<size_t>(k)]->rooted_graphs() == (gather ? 3u * n : 64u));
      std::vector<float> want;
      if (gather) {
        for (const auto& v : in) want.insert(want.end(), v.begin(), v.end());
      } else {
        want = in[5];
      }
      CHECK(r.out[static_cast<size_t>(k)] == want);
    }
  }
}
