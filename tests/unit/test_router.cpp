// The router hands each frame to the service registered for its type (or its type and
// reserved name) and every link loss to every service once; the vocabulary's lists give
// every kind and status its one name.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/op_kind.h"
#include "common/status.h"
#include "monitor/metric_names.h"
#include "runtime/router.h"

using namespace taiji;

namespace {

struct Recorder final : ReceiveHandler {
  std::vector<std::string> seen;
  uint8_t buffer[8] = {};
  Status accept_frame(int src, const FrameHeader& h, const std::string& name, const uint8_t*,
                      uint8_t** target) override {
    *target = buffer;
    seen.push_back("accept " + std::to_string(src) + " " + std::to_string(static_cast<int>(h.type)) + " " + name);
    return {};
  }
  void frame_done(int src, const FrameHeader& h, const std::string& name) override {
    seen.push_back("done " + std::to_string(src) + " " + std::to_string(static_cast<int>(h.type)) + " " + name);
  }
  void link_down(int src, bool graceful, const Status&) override {
    seen.push_back("down " + std::to_string(src) + (graceful ? " bye" : " lost"));
  }
};

FrameHeader of(MsgType type) {
  FrameHeader h;
  h.type = type;
  return h;
}

void deliver(Router& r, int src, MsgType type, const std::string& name) {
  uint8_t* target = nullptr;
  REQUIRE(r.accept_frame(src, of(type), name, nullptr, &target).is_ok());
  r.frame_done(src, of(type), name);
}

}  // namespace

TEST_CASE("router: frames go by type, a reserved name ahead of its type's service", "[router]") {
  Recorder ops, stalls, probes;
  Router r;
  r.add(MsgType::Data, &ops);
  r.add(MsgType::Ready, &ops);
  r.add(MsgType::Query, &stalls);
  r.add(MsgType::Query, &probes, "taiji.probe");
  deliver(r, 1, MsgType::Data, "w");
  deliver(r, 2, MsgType::Query, "w");
  deliver(r, 2, MsgType::Query, "taiji.probe");
  deliver(r, 0, MsgType::Ready, "taiji.probe");  // the name is reserved for Query only
  CHECK(ops.seen == std::vector<std::string>{"accept 1 3 w", "done 1 3 w", "accept 0 2 taiji.probe",
                                             "done 0 2 taiji.probe"});
  CHECK(stalls.seen == std::vector<std::string>{"accept 2 7 w", "done 2 7 w"});
  CHECK(probes.seen == std::vector<std::string>{"accept 2 7 taiji.probe", "done 2 7 taiji.probe"});
}

TEST_CASE("router: a frame no service takes is a protocol error", "[router]") {
  Recorder ops;
  Router r;
  r.add(MsgType::Data, &ops);
  uint8_t stale = 0;
  uint8_t* target = &stale;
  Status s = r.accept_frame(0, of(MsgType::Answer), "w", nullptr, &target);
  CHECK(s.code() == Code::Protocol);
  CHECK(s.message() == "unexpected frame type");
  CHECK(target == nullptr);
  CHECK(ops.seen.empty());
}

TEST_CASE("router: a link loss reaches every service once, in registration order", "[router]") {
  Recorder a, b;
  Router r;
  r.add(MsgType::Data, &a);
  r.add(MsgType::Query, &b);
  r.add(MsgType::Answer, &b);
  r.add(MsgType::Answer, &a, "taiji.probe");
  r.link_down(3, true, {});
  r.link_down(1, false, {Code::PeerLost, "gone"});
  CHECK(a.seen == std::vector<std::string>{"down 3 bye", "down 1 lost"});
  CHECK(b.seen == std::vector<std::string>{"down 3 bye", "down 1 lost"});
}

TEST_CASE("vocabulary: op kinds and statuses have one name each", "[router]") {
  CHECK(kOpKindCount == 11);
  CHECK(kMaxOpKind == 10);
  CHECK(std::string(op_kind_name(OpKind::ReduceScatter)) == "reduce_scatter");
  CHECK(std::string(op_kind_label(static_cast<uint8_t>(OpKind::Consensus))) == "consensus");
  CHECK(std::string(op_kind_label(kMaxOpKind + 1)) == "none");
  CHECK(op_kind_reduces(OpKind::Reduce));
  CHECK_FALSE(op_kind_reduces(OpKind::Gather));
  CHECK(op_kind_rooted(OpKind::Gather));
  CHECK_FALSE(op_kind_rooted(OpKind::Allgather));
  CHECK(std::string(op_kind_label(static_cast<uint8_t>(OpKind::Recv))) == "recv");
  CHECK(op_kind_partner(OpKind::Send) == OpKind::Recv);
  CHECK(op_kind_partner(OpKind::Recv) == OpKind::Send);
  CHECK(op_kind_partner(OpKind::Gather) == OpKind::Gather);
  CHECK(std::string(status_label(static_cast<int32_t>(Code::InProgress))) == "in_progress");
  CHECK(std::string(status_label(static_cast<int32_t>(Code::VersionMismatch))) == "version");
  CHECK(std::string(status_label(static_cast<int32_t>(Code::Auth))) == "auth");
  CHECK(std::string(status_label(static_cast<int32_t>(Code::NotFound))) == "not_found");
  CHECK(std::string(status_label(static_cast<int32_t>(Code::NoDevice))) == "no_device");
  CHECK(std::string(status_label(-20)) == "unknown");
  CHECK(std::string(status_label(2)) == "unknown");
}
