// CollectiveOp's state machine driven for n ranks in one process: chunks go from op to op
// through a queue, as the engine would move them, so a test sees every message and every
// result.
#pragma once

#include <catch2/catch.hpp>

#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#include "collectives/collective_op.h"
#include "topology/strategies.h"

namespace taiji_test {

using namespace taiji;

inline std::shared_ptr<const Strategy> strategy(const char* name, int n) {
  auto made = make_strategy(name, n, {});
  REQUIRE(made.is_ok());
  return std::make_shared<const Strategy>(std::move(made.value()));
}

inline CollectiveSpec spec_for(OpKind kind, RedOp op, const std::shared_ptr<const Strategy>& s, int n,
                               int rank, const float* send, float* recv, uint64_t count) {
  CollectiveSpec spec;
  spec.kind = kind;
  spec.dtype = DType::F32;
  spec.redop = op;
  spec.count = count;
  spec.send = send;
  spec.recv = recv;
  spec.rank = rank;
  spec.size = n;
  spec.strategy = s;
  return spec;
}

struct Message {
  int src;
  ChunkSend send;
  std::vector<uint8_t> payload;   // copied when sent, as a transport would
};

struct Run {
  std::vector<std::vector<float>> out;
  std::vector<int> sent;          // messages per rank
  int read_in_memory = 0;         // payloads target() chose to read where they lay
  bool done = true;
};

// How run() hands each payload over.
enum class Receive {
  Copy,      // into the buffer target() names, as the TCP transport does
  InMemory,  // from where it lies (target() told so), as the shared-memory transport does
};

// Starts the ops (one per rank, in rank order) and delivers every message they send in
// FIFO order until none is left; counts messages into r and ends with r.done.
inline void drive(std::vector<std::unique_ptr<CollectiveOp>>& ops, Run& r,
                  Receive receive = Receive::Copy) {
  r.sent.assign(ops.size(), 0);
  std::deque<Message> queue;
  auto post = [&](int src, std::vector<ChunkSend>& sends) {
    for (const ChunkSend& c : sends) {
      queue.push_back({src, c, std::vector<uint8_t>(c.data, c.data + c.bytes)});
      ++r.sent[static_cast<size_t>(src)];
    }
    sends.clear();
  };
  std::vector<ChunkSend> sends;
  for (size_t k = 0; k < ops.size(); ++k) {
    ops[k]->start(&sends);
    post(static_cast<int>(k), sends);
  }
  while (!queue.empty()) {
    Message m = std::move(queue.front());
    queue.pop_front();
    CollectiveOp& dst = *ops[static_cast<size_t>(m.send.dst)];
    uint8_t* into = nullptr;
    const uint8_t* lies = receive == Receive::InMemory && !m.payload.empty() ? m.payload.data() : nullptr;
    Status st = dst.target(m.src, m.send.chunk, m.send.stage, m.send.offset, m.send.bytes, &into, lies);
    INFO(st.message());
    REQUIRE(st.is_ok());
    if (into == nullptr && !m.payload.empty()) {
      REQUIRE(lies != nullptr);
      ++r.read_in_memory;
    } else if (!m.payload.empty()) {
      std::memcpy(into, m.payload.data(), m.payload.size());
    }
    dst.delivered(m.src, m.send.chunk, m.send.stage, &sends);
    post(m.send.dst, sends);
  }
  for (const auto& o : ops) r.done = r.done && o->done();
}

// Runs one op on n ranks over `s`; in place: each rank's output buffer starts as its input
// and is passed as both.
inline Run run(OpKind kind, RedOp op, const std::shared_ptr<const Strategy>& s, int n,
               const std::vector<std::vector<float>>& in, uint64_t count, bool in_place = false,
               Receive receive = Receive::Copy, uint64_t chunk_bytes = CollectiveSpec().chunk_bytes) {
  Run r;
  r.out.assign(static_cast<size_t>(n), std::vector<float>(count, -1.0f));
  if (in_place) r.out = in;
  std::vector<std::unique_ptr<CollectiveOp>> ops;
  for (int k = 0; k < n; ++k) {
    const float* send = kind == OpKind::Barrier ? nullptr
                        : in_place                ? r.out[static_cast<size_t>(k)].data()
                                                  : in[static_cast<size_t>(k)].data();
    CollectiveSpec spec = spec_for(kind, op, s, n, k, send, r.out[static_cast<size_t>(k)].data(), count);
    spec.chunk_bytes = chunk_bytes;
    ops.push_back(std::make_unique<CollectiveOp>(spec));
  }
  drive(ops, r, receive);
  return r;
}

inline std::vector<std::vector<float>> random_inputs(int n, uint64_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  std::vector<std::vector<float>> in(static_cast<size_t>(n), std::vector<float>(count));
  for (auto& v : in) {
    for (float& x : v) x = dist(gen);
  }
  return in;
}

}  // namespace taiji_test
