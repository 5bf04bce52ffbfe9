// The sequencer's semantics: completion, order, ids, mismatches and withdrawals. Its byte
// format's edges (malformed input, truncation, fuzzing) are in test_sequencer_wire.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>

#include "sequencer_job.h"

using namespace taiji;
using namespace taiji::seq_test;

TEST_CASE("sequencer: describe names kind, dtype, reduction, count and root", "[sequencer]") {
  CHECK(describe(spec(1024)) == "allreduce f32 sum count 1024");
  CHECK(describe({OpKind::Broadcast, DType::F64, RedOp::Sum, 8, 2}) == "broadcast f64 count 8 root 2");
  CHECK(describe({OpKind::Reduce, DType::I32, RedOp::Max, 3, 1}) == "reduce i32 max count 3 root 1");
  CHECK(describe({OpKind::Allgather, DType::BF16, RedOp::Sum, 0, 0}) == "allgather bf16 count 0");
  CHECK(describe({OpKind::ReduceScatter, DType::U8, RedOp::Avg, 5, 0}) == "reduce_scatter u8 avg count 5");
}

TEST_CASE("sequencer: with one rank every announcement completes at once", "[sequencer]") {
  Job job(1);
  REQUIRE(job.send(0, {{"a", 1, spec(4)}, {"b", 1, spec(8)}, {"c", 7, spec(4)}}).is_ok());
  CHECK(job.seq.pending() == 0);
  CHECK(job.order() == Entries{run("a", 1), run("b", 1), run("c", 7)});
  CHECK(job.seq.cached() == 3);
  CHECK(job.seq.take_order().empty());
}

TEST_CASE("sequencer: an op is ordered when its last rank announces it, in completion order", "[sequencer]") {
  Job job(3);
  REQUIRE(job.send(0, {{"a", 1, spec(1)}, {"b", 1, spec(2)}, {"c", 1, spec(3)}}).is_ok());
  REQUIRE(job.send(1, {{"c", 1, spec(3)}, {"b", 1, spec(2)}, {"a", 1, spec(1)}}).is_ok());
  CHECK(job.seq.pending() == 3);
  CHECK(job.seq.take_order().empty());
  REQUIRE(job.send(2, {{"c", 1, spec(3)}, {"a", 1, spec(1)}}).is_ok());
  REQUIRE(job.send(2, {{"b", 1, spec(2)}}).is_ok());
  CHECK(job.seq.pending() == 0);
  CHECK(job.order() == Entries{run("c", 1), run("a", 1), run("b", 1)});
  // The same name at the next version is a new op.
  REQUIRE(job.send(1, {{"a", 2, spec(1)}}).is_ok());
  CHECK(job.seq.pending() == 1);
  CHECK(job.seq.take_order().empty());
}

TEST_CASE("sequencer: after its first run an op is announced and ordered by id, 13 bytes each", "[sequencer]") {
  Job job(4);
  std::vector<Op> ops;
  size_t full = 5;
  for (int i = 0; i < 10; ++i) {
    ops.push_back({"layer." + std::to_string(i) + ".weight", 1, spec(100 + i)});
    full += 1 + 2 + ops.back().name.size() + 8 + 15;
  }
  for (int r = 0; r < 4; ++r) {
    auto msg = job.encode(r, ops);
    CHECK(msg.size() == full);
    REQUIRE(job.seq.receive(r, msg.data(), msg.size()).is_ok());
  }
  CHECK(job.order().size() == 10);
  CHECK(job.seq.cached() == 10);
  for (const auto& c : job.clients) CHECK(SequencerClientAccess::ids(c) == 10);

  for (auto& op : ops) op.version = 2;
  std::vector<uint8_t> order;
  for (int r = 0; r < 4; ++r) {
    std::reverse(ops.begin(), ops.end());
    auto msg = job.encode(r, ops);
    CHECK(msg.size() == 5 + 13 * 10);
    REQUIRE(job.seq.receive(r, msg.data(), msg.size()).is_ok());
  }
  order = job.seq.take_order();
  CHECK(order.size() == 5 + 13 * 10);
  auto entries = job.read(order);
  REQUIRE(entries.size() == 10);
  for (int i = 0; i < 10; ++i) CHECK(entries[i] == run(ops[i].name, 2));

  // A new spec under a known name is a new (name, spec): announced in full, a new id.
  for (int r = 0; r < 4; ++r) REQUIRE(job.send(r, {{"layer.0.weight", 3, spec(7)}}).is_ok());
  CHECK(job.order() == Entries{run("layer.0.weight", 3)});
  CHECK(job.seq.cached() == 11);
}

TEST_CASE("sequencer: a mismatch names the ranks that differ and how", "[sequencer]") {
  const std::string head = "ranks disagree on 'grad.3' version 2: ranks 0,1 ";
  struct Case {
    const char* what;
    DeviceOpSpec agreed, odd;
    std::string why;
  };
  const DeviceOpSpec bcast{OpKind::Broadcast, DType::F32, RedOp::Sum, 64, 0};
  std::vector<Case> cases = {
      {"count", spec(1024), spec(512),
       head + "allreduce f32 sum count 1024, rank 2 allreduce f32 sum count 512"},
      {"dtype", spec(8), spec(8, DType::F16), head + "allreduce f32 sum count 8, rank 2 allreduce f16 sum count 8"},
      {"redop", spec(8), spec(8, DType::F32, RedOp::Max),
       head + "allreduce f32 sum count 8, rank 2 allreduce f32 max count 8"},
      {"root", bcast, {OpKind::Broadcast, DType::F32, RedOp::Sum, 64, 2},
       head + "broadcast f32 count 64 root 0, rank 2 broadcast f32 count 64 root 2"},
      {"kind", spec(8), {OpKind::ReduceScatter, DType::F32, RedOp::Sum, 8, 0},
       head + "allreduce f32 sum count 8, rank 2 reduce_scatter f32 sum count 8"},
  };
  for (const Case& c : cases) {
    SECTION(c.what) {
      Job job(3);
      // The odd rank announces first: the text lists groups by their lowest rank all the same.
      REQUIRE(job.send(2, {{"grad.3", 2, c.odd}}).is_ok());
      REQUIRE(job.send(0, {{"grad.3", 2, c.agreed}}).is_ok());
      CHECK(job.seq.take_order().empty());
      REQUIRE(job.send(1, {{"grad.3", 2, c.agreed}}).is_ok());
      CHECK(job.order() == Entries{failed("grad.3", 2, OrderEntry::Verdict::Mismatch, c.why)});
      CHECK(job.seq.cached() == 0);
      CHECK(job.seq.pending() == 0);
      // Nothing is left of it: the next version, agreed, runs.
      for (int r = 0; r < 3; ++r) REQUIRE(job.send(r, {{"grad.3", 3, c.agreed}}).is_ok());
      CHECK(job.order() == Entries{run("grad.3", 3)});
    }
  }
}

TEST_CASE("sequencer: mismatch groups ranks by spec; fields a kind ignores do not count", "[sequencer]") {
  Job job(6);
  const int counts[] = {4, 5, 4, 4, 4, 6};
  for (int r : {5, 1, 0, 2, 3, 4}) REQUIRE(job.send(r, {{"w", 1, spec(counts[r])}}).is_ok());
  CHECK(job.order() == Entries{failed("w", 1, OrderEntry::Verdict::Mismatch,
                                      "ranks disagree on 'w' version 1: ranks 0,2-4 allreduce f32 sum count 4, "
                                      "rank 1 allreduce f32 sum count 5, rank 5 allreduce f32 sum count 6")});

  // A broadcast has no reduction and an allreduce no root: ranks may leave junk there.
  for (int r = 0; r < 6; ++r) {
    REQUIRE(job.send(r, {{"b", 1, {OpKind::Broadcast, DType::F32, static_cast<RedOp>(r % 5), 9, 1}},
                         {"s", 1, {OpKind::Allreduce, DType::F32, RedOp::Sum, 9, r}}})
                .is_ok());
  }
  CHECK(job.order() == Entries{run("b", 1), run("s", 1)});
}

TEST_CASE("sequencer: a withdrawal before every rank announced fails the op everywhere", "[sequencer]") {
  Job job(3);
  REQUIRE(job.send(0, {{"a", 1, spec(1)}}).is_ok());
  REQUIRE(job.send(1, {{"a", 1, spec(1)}}).is_ok());
  std::vector<uint8_t> msg;
  job.clients[1].withdraw("a", 1, msg);
  REQUIRE(job.seq.receive(1, msg.data(), msg.size()).is_ok());
  CHECK(job.seq.pending() == 0);
  const std::string withdrew = "rank 1 withdrew it (timed out) before every rank had posted it; ";
  CHECK(job.order() == Entries{failed("a", 1, OrderEntry::Verdict::Withdrawn, withdrew + "posted by ranks 0,1")});

  // The announcement still on its way does not start it again.
  REQUIRE(job.send(2, {{"a", 1, spec(1)}}).is_ok());
  CHECK(job.seq.pending() == 0);
  CHECK(job.order() ==
        Entries{failed("a", 1, OrderEntry::Verdict::Withdrawn, withdrew + "rank 2 posted it after")});

  // A second rank timing out on it too changes nothing.
  msg.clear();
  job.clients[0].withdraw("a", 1, msg);
  REQUIRE(job.seq.receive(0, msg.data(), msg.size()).is_ok());
  CHECK(job.seq.take_order().empty());

  // Announced and withdrawn in one message.
  msg.clear();
  job.clients[2].announce("b", 4, spec(1), msg);
  job.clients[2].withdraw("b", 4, msg);
  REQUIRE(job.seq.receive(2, msg.data(), msg.size()).is_ok());
  CHECK(job.order() ==
        Entries{failed("b", 4, OrderEntry::Verdict::Withdrawn,
                       "rank 2 withdrew it (timed out) before every rank had posted it; posted by rank 2")});
}

TEST_CASE("sequencer: a withdrawal of an op already ordered, or not announced by its rank, is ignored",
          "[sequencer]") {
  Job job(3);
  for (int r = 0; r < 3; ++r) REQUIRE(job.send(r, {{"a", 1, spec(1)}}).is_ok());
  CHECK(job.order() == Entries{run("a", 1)});
  std::vector<uint8_t> msg;
  job.clients[1].withdraw("a", 1, msg);
  REQUIRE(job.seq.receive(1, msg.data(), msg.size()).is_ok());
  CHECK(job.seq.take_order().empty());
  CHECK(job.seq.pending() == 0);

  // Rank 1's withdrawal of an earlier 'b' version 1 crosses a new one that rank 0 began.
  REQUIRE(job.send(0, {{"b", 1, spec(1)}}).is_ok());
  msg.clear();
  job.clients[1].withdraw("b", 1, msg);
  REQUIRE(job.seq.receive(1, msg.data(), msg.size()).is_ok());
  CHECK(job.seq.take_order().empty());
  CHECK(job.seq.pending() == 1);
  REQUIRE(job.send(1, {{"b", 1, spec(1)}}).is_ok());
  REQUIRE(job.send(2, {{"b", 1, spec(1)}}).is_ok());
  CHECK(job.order() == Entries{run("b", 1)});
}

TEST_CASE("sequencer: the memory of withdrawn ops keeps the last 4096", "[sequencer]") {
  Job job(2);
  for (int i = 0; i <= 4096; ++i) {
    std::vector<uint8_t> msg;
    job.clients[0].announce("op." + std::to_string(i), 1, spec(1), msg);
    job.clients[0].withdraw("op." + std::to_string(i), 1, msg);
    REQUIRE(job.seq.receive(0, msg.data(), msg.size()).is_ok());
  }
  CHECK(job.order().size() == 4097);
  REQUIRE(job.send(1, {{"op.1", 1, spec(1)}}).is_ok());
  CHECK(job.order().at(0).verdict == OrderEntry::Verdict::Withdrawn);
  REQUIRE(job.send(1, {{"op.0", 1, spec(1)}}).is_ok());  // forgotten: waits for rank 0
  CHECK(job.seq.take_order().empty());
  CHECK(job.seq.pending() == 1);
}

TEST_CASE("sequencer: an op announced twice by one rank is a Protocol error; nothing of it applies",
          "[sequencer]") {
  Job job(2);
  Status s = job.send(0, {{"a", 1, spec(1)}, {"b", 1, spec(1)}, {"a", 1, spec(1)}});
  CHECK(s.code() == Code::Protocol);
  CHECK(s.message().find("'a' version 1 twice") != std::string::npos);
  CHECK(job.seq.pending() == 0);

  REQUIRE(job.send(0, {{"a", 1, spec(1)}}).is_ok());
  CHECK(job.send(0, {{"c", 1, spec(1)}, {"a", 1, spec(1)}}).code() == Code::Protocol);
  CHECK(job.seq.pending() == 1);
  REQUIRE(job.send(1, {{"a", 1, spec(1)}}).is_ok());
  CHECK(job.order() == Entries{run("a", 1)});
}

TEST_CASE("sequencer: an id the coordinator never assigned is a Protocol error", "[sequencer]") {
  Job other(1);
  REQUIRE(other.send(0, {{"a", 1, spec(1)}, {"b", 1, spec(1)}}).is_ok());
  other.order();
  Sequencer fresh(1);
  std::vector<uint8_t> msg;
  other.clients[0].announce("b", 2, spec(1), msg);  // by id 1, which `fresh` never gave
  CHECK(msg.size() == 5 + 13);
  Status s = fresh.receive(0, msg.data(), msg.size());
  CHECK(s.code() == Code::Protocol);
  CHECK(s.message() == "sequencer: rank 0: announcement by unknown id 1");
  CHECK(fresh.pending() == 0);
  CHECK(fresh.take_order().empty());
}

TEST_CASE("sequencer: a rank outside the job is refused", "[sequencer]") {
  Sequencer seq(2);
  std::vector<uint8_t> msg;
  SequencerClient().announce("a", 1, spec(1), msg);
  CHECK(seq.receive(2, msg.data(), msg.size()).code() == Code::InvalidArgument);
  CHECK(seq.receive(-1, msg.data(), msg.size()).code() == Code::InvalidArgument);
  CHECK(seq.pending() == 0);
}

TEST_CASE("sequencer: 8 ranks posting 200 ops each in their own order agree on one order", "[sequencer]") {
  constexpr int kRanks = 8, kOps = 200;
  Job job(kRanks);
  std::mt19937 rng(20240611);
  for (uint64_t version = 1; version <= 2; ++version) {
    std::vector<std::vector<Op>> todo(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      for (int i = 0; i < kOps; ++i) todo[r].push_back({"t" + std::to_string(i), version, spec(i + 1)});
      std::shuffle(todo[r].begin(), todo[r].end(), rng);
    }
    std::map<std::string, int> announced;
    Entries expected, got;
    while (std::any_of(todo.begin(), todo.end(), [](const auto& t) { return !t.empty(); })) {
      const int r = static_cast<int>(rng() % kRanks);
      if (todo[r].empty()) continue;
      const size_t n = std::min<size_t>(todo[r].size(), 1 + rng() % 10);
      std::vector<Op> batch(todo[r].begin(), todo[r].begin() + n);
      todo[r].erase(todo[r].begin(), todo[r].begin() + n);
      auto msg = job.encode(r, batch);
      // The first round announces in full; every later one by id alone.
      if (version > 1) CHECK(msg.size() == 5 + 13 * n);
      REQUIRE(job.seq.receive(r, msg.data(), msg.size()).is_ok());
      for (const Op& op : batch) {
        if (++announced[op.name] == kRanks) expected.push_back(run(op.name, version));
      }
      if (rng() % 4 == 0) {
        for (auto& e : job.order()) got.push_back(std::move(e));
      }
    }
    for (auto& e : job.order()) got.push_back(std::move(e));
    CHECK(job.seq.pending() == 0);
    CHECK(got.size() == static_cast<size_t>(kOps));
    CHECK(got == expected);
  }
  CHECK(job.seq.cached() == static_cast<size_t>(kOps));
}

TEST_CASE("sequencer: past 65536 ids, new ops are announced and ordered by name", "[sequencer]") {
  Job job(1);
  std::vector<Op> ops;
  for (int i = 0; i < 65536; ++i) ops.push_back({"op." + std::to_string(i), 1, spec(1)});
  REQUIRE(job.send(0, ops).is_ok());
  CHECK(job.order().size() == 65536);
  CHECK(job.seq.cached() == 65536);
  for (int round = 1; round <= 2; ++round) {
    auto msg = job.encode(0, {{"extra", static_cast<uint64_t>(round), spec(1)}});
    CHECK(msg.size() == 5 + 1 + 2 + 5 + 8 + 15);
    REQUIRE(job.seq.receive(0, msg.data(), msg.size()).is_ok());
    auto order = job.seq.take_order();
    CHECK(order.size() == 5 + 1 + 2 + 5 + 8);
    CHECK(job.read(order) == Entries{run("extra", static_cast<uint64_t>(round))});
  }
  CHECK(job.seq.cached() == 65536);
  CHECK(SequencerClientAccess::ids(job.clients[0]) == 65536);
}
