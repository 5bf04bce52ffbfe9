// A coordinator and one client per rank, in one process, for the sequencer's tests.
#pragma once

#include <catch2/catch.hpp>

#include <ostream>
#include <string>
#include <vector>

#include "device/sequencer.h"

namespace taiji {

// What a client has learnt, without a public accessor for it.
struct SequencerClientAccess {
  static size_t ids(const SequencerClient& c) { return c.names_.size(); }
};

inline bool operator==(const OrderEntry& a, const OrderEntry& b) {
  return a.name == b.name && a.version == b.version && a.verdict == b.verdict && a.why == b.why;
}

inline std::ostream& operator<<(std::ostream& os, const OrderEntry& e) {
  return os << "{'" << e.name << "' v" << e.version << " verdict " << static_cast<int>(e.verdict) << " '"
            << e.why << "'}";
}

namespace seq_test {

using Entries = std::vector<OrderEntry>;

struct Op {
  std::string name;
  uint64_t version = 1;
  DeviceOpSpec spec;
};

inline DeviceOpSpec spec(uint64_t count, DType dtype = DType::F32, RedOp redop = RedOp::Sum) {
  return {OpKind::Allreduce, dtype, redop, count, 0};
}

inline OrderEntry run(const std::string& name, uint64_t version) {
  return {name, version, OrderEntry::Verdict::Run, ""};
}

inline OrderEntry failed(const std::string& name, uint64_t version, OrderEntry::Verdict v, const std::string& why) {
  return {name, version, v, why};
}

struct Job {
  Sequencer seq;
  std::vector<SequencerClient> clients;

  explicit Job(int size) : seq(size), clients(size) {}

  std::vector<uint8_t> encode(int rank, const std::vector<Op>& ops) {
    std::vector<uint8_t> msg;
    for (const Op& op : ops) clients[rank].announce(op.name, op.version, op.spec, msg);
    return msg;
  }

  Status send(int rank, const std::vector<Op>& ops) {
    auto msg = encode(rank, ops);
    return seq.receive(rank, msg.data(), msg.size());
  }

  // Every client reads the message; all must decode the same entries.
  Entries read(const std::vector<uint8_t>& msg) {
    Entries first;
    for (size_t r = 0; r < clients.size(); ++r) {
      auto got = clients[r].read_order(msg.data(), msg.size());
      REQUIRE(got.is_ok());
      if (r == 0) {
        first = got.value();
      } else {
        CHECK(got.value() == first);
      }
    }
    return first;
  }

  // The next batch as every client reads it; empty when there is none.
  Entries order() {
    auto msg = seq.take_order();
    if (msg.empty()) return {};
    return read(msg);
  }
};

}  // namespace seq_test
}  // namespace taiji
