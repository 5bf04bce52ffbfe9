// A fake member: rank 0 is a real peer, rank 1 is this test, which completed the real
// handshake and then sends frames built by hand for an allreduce of two f32 named "w".
// Frames that pass the header check but not the op's own checks must fail that op with an
// error naming rank 1 and the fault, tell rank 1, and leave the link up for the next
// version; frames the header check refuses must close the link and fail rank 0's ops with
// PeerLost naming rank 1. Rank 0 never crashes and is destroyed promptly either way.
// Leaving with data still queued for rank 1, rank 0 sends it all, then its Bye, then
// nothing: rank 1 sees a departure, not a lost link.
#include <catch2/catch.hpp>

#include <signal.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "fake_member.h"
#include "live_peers.h"
#include "log_capture.h"
#include "member_ops.h"
#include "raw_socket.h"

using namespace taiji;
using namespace wire;

namespace {

constexpr int kRepeats = 1000;
constexpr int kWarmup = 20;
constexpr double kLinkCaseSeconds = 10;

std::string ends(const std::shared_ptr<RequestState>& request, Status* status) {
  if (!request->wait_for(kBoundMs, status)) return "the op did not end within 10 s";
  return {};
}

// A complete, valid allreduce with the fake: rank 0 must get the exact sum and send it back.
std::string valid_allreduce(Peer& victim, FakeMember& fake, std::array<float, 2>* out) {
  std::shared_ptr<RequestState> request;
  std::string wrong = allreduce_checked(victim, fake, out, [&](const Frame& ready) {
    fake.send(concat({member_ready(ready), frame(member_data(ready.header), kOp, theirs())}));
  }, &request);
  if (!wrong.empty()) return "valid allreduce: " + wrong;
  Frame result;
  Status s = fake.await(MsgType::Data, kOp, request->version(), after_ms(kBoundMs), &result);
  if (!s.is_ok()) return "rank 0 sent no result: " + s.message();
  if (result.header.stage != static_cast<uint8_t>(Stage::Broadcast) ||
      result.payload != bytes_of(out->data(), out->size())) {
    return "rank 0 sent rank 1 a wrong result";
  }
  return {};
}

// ---------------------------------------------------------------------------------------
// Faults inside a well-formed frame: the op fails, the link stays.

struct OpFault {
  std::string what;
  std::function<std::vector<uint8_t>(const Frame& ready)> frames;
  std::vector<std::string> says;  // in rank 0's error, its log line and its Abort to rank 1
};

std::vector<uint8_t> data_with(const Frame& ready, const std::function<void(FrameHeader&)>& edit,
                               std::vector<uint8_t> payload = theirs()) {
  FrameHeader h = member_data(ready.header);
  edit(h);
  return frame(h, ready.name, payload);
}

std::vector<OpFault> op_faults() {
  return {
      {"duplicate chunk",
       [](const Frame& r) { return concat({data_with(r, [](FrameHeader&) {}), data_with(r, [](FrameHeader&) {})}); },
       {"chunk 0 from rank 1: duplicate chunk"}},
      {"chunk index past the last chunk",
       [](const Frame& r) { return data_with(r, [](FrameHeader& h) { h.chunk = 7; }); },
       {"chunk 7 from rank 1: past the last chunk 0"}},
      {"chunk offset past the end of the buffer",
       [](const Frame& r) { return data_with(r, [](FrameHeader& h) { h.offset = 2; }); },
       {"chunk 0 from rank 1: offset/length 2/8 do not match the chunk plan 0/8"}},
      {"chunk longer than the buffer",
       [](const Frame& r) { return data_with(r, [](FrameHeader&) {}, std::vector<uint8_t>(16, 0x40)); },
       {"chunk 0 from rank 1: offset/length 0/16 do not match the chunk plan 0/8"}},
      {"mismatched count",
       [](const Frame& r) {
         return data_with(r, [](FrameHeader& h) { h.count = 3; }, std::vector<uint8_t>(12, 0x40));
       },
       {"rank 1 posted allreduce count 3 f32 sum", "rank 0 posted allreduce count 2 f32 sum"}},
      {"mismatched dtype",
       [](const Frame& r) { return data_with(r, [](FrameHeader& h) { h.dtype = static_cast<uint8_t>(DType::I32); }); },
       {"rank 1 posted allreduce count 2 i32 sum", "rank 0 posted allreduce count 2 f32 sum"}},
      {"mismatched reduction op",
       [](const Frame& r) { return data_with(r, [](FrameHeader& h) { h.redop = static_cast<uint8_t>(RedOp::Max); }); },
       {"rank 1 posted allreduce count 2 f32 max", "rank 0 posted allreduce count 2 f32 sum"}},
      {"mismatched Ready",
       [](const Frame& r) {
         Frame other = r;
         other.header.count = 5;
         return member_ready(other);
       },
       {"rank 1 posted allreduce count 5 f32 sum", "rank 0 posted allreduce count 2 f32 sum"}},
  };
}

std::string op_fault_once(Peer& victim, FakeMember& fake, LogCapture& log, const OpFault& f,
                          std::array<float, 2>* out) {
  std::shared_ptr<RequestState> request;
  Frame ready;
  std::string wrong = post_op(victim, fake, out, &request, &ready);
  if (!wrong.empty()) return wrong;
  const uint64_t v = request->version();
  if (!fake.send(f.frames(ready))) return "rank 0 closed the link";
  Status s;
  wrong = ends(request, &s);
  if (!wrong.empty()) return wrong;
  if (s.code() != Code::Mismatch) {
    return "version " + std::to_string(v) + " ended with code " + std::to_string(static_cast<int>(s.code())) +
           " '" + s.message() + "', not a mismatch";
  }
  std::vector<std::string> says = f.says;
  says.push_back("'w' version " + std::to_string(v));
  for (const std::string& part : says) {
    if (s.message().find(part) == std::string::npos) return "error '" + s.message() + "' lacks '" + part + "'";
  }
  Frame abort;
  Status told = fake.await(MsgType::Abort, kOp, v, after_ms(kBoundMs), &abort);
  if (!told.is_ok()) return "rank 0 did not tell rank 1: " + told.message();
  if (std::string(abort.payload.begin(), abort.payload.end()) != s.message()) {
    return "rank 0 told rank 1 something else: " + std::string(abort.payload.begin(), abort.payload.end());
  }
  return expect_lines(log.take_at_least(1, kBoundMs), 1, spdlog::level::err, s.message());
}

// ---------------------------------------------------------------------------------------
// Frames the transport refuses: the link to rank 1 closes.

struct LinkFault {
  std::string what;
  std::function<std::vector<uint8_t>(const Frame& ready)> frames;
  std::string cause;  // the transport's reason
};

std::vector<LinkFault> link_faults() {
  return {
      {"Data frame with an unknown dtype",
       [](const Frame& r) { return data_with(r, [](FrameHeader& h) { h.dtype = 200; }); }, "bad dtype 200"},
      {"Data frame with an unknown reduction op",
       [](const Frame& r) { return data_with(r, [](FrameHeader& h) { h.redop = 200; }); }, "bad redop 200"},
      {"a frame claiming rank 0",
       [](const Frame& r) { return data_with(r, [](FrameHeader& h) { h.src_rank = 0; }); },
       "frame claims rank 0 on the connection of rank 1"},
      {"garbage after a valid frame",
       [](const Frame& r) { return concat({member_ready(r), std::vector<uint8_t>(64, 0xA5)}); },
       "bad magic 0xa5a5a5a5"},
      {"a Hello on the open connection",
       [](const Frame&) {
         FrameHeader h;
         h.type = MsgType::Hello;
         h.src_rank = 1;
         h.cluster_version = kClusterVersion;
         return frame(h, "wire-link");
       },
       "handshake frame on an open connection"},
  };
}

struct LinkRun {
  std::string wrong;
  double destroy_ms = 0;
};

LinkRun link_fault_once(const Rendezvous& rv, const std::string& job, LogCapture& log,
                        const LinkFault& f) {
  LinkRun run;
  std::array<float, 2> out{};
  FakeMember fake;
  std::unique_ptr<Peer> victim;
  run.wrong = start_with_fake(base_config(0, rv.address, job), "", &fake, &victim);
  if (!run.wrong.empty()) return run;
  std::shared_ptr<RequestState> request;
  Frame ready;
  run.wrong = post_op(*victim, fake, &out, &request, &ready);
  if (!run.wrong.empty()) return run;
  fake.send(f.frames(ready));
  Status s;
  run.wrong = ends(request, &s);
  if (!run.wrong.empty()) return run;
  const std::string lost = "rank 1 lost: " + f.cause;
  if (s.code() != Code::PeerLost || s.message() != lost) {
    run.wrong = "op ended with '" + s.message() + "', want PeerLost '" + lost + "'";
    return run;
  }
  if (fake.socket().wait_closed(after_ms(kBoundMs)) == RawSocket::Closed::StillOpen) {
    run.wrong = "rank 0 kept the link to rank 1 open";
    return run;
  }
  if (victim->async_error().code() != Code::PeerLost) {
    run.wrong = "rank 0's sticky error is '" + victim->async_error().message() + "'";
    return run;
  }
  run.wrong = expect_lines(log.take_at_least(1, kBoundMs), 1, spdlog::level::err,
                           "link to rank 1 lost: " + f.cause);
  if (!run.wrong.empty()) return run;
  auto t0 = Clock::now();
  victim.reset();
  run.destroy_ms = ms_between(t0, Clock::now());
  std::vector<LogLine> after = log.take();
  if (!after.empty()) run.wrong = "rank 0 logged on destruction: " + after[0].text;
  return run;
}

// ---------------------------------------------------------------------------------------
// Leaving with data still queued: the Bye waits behind it and nothing may follow it.

constexpr const char* kBulk = "bulk";
// 32 KiB of f32: one chunk, so rank 0 writes each result as one frame. Well under the
// 64 KiB queued for a rank past which rank 0 answers none of its Queries (op_engine.cpp):
// with one result stuck in the write queue, a Query is still answered.
constexpr uint64_t kBulkCount = 8192;
// Loopback socket buffers hold a few MiB; this bounds the fill where they hold far more.
constexpr int kMaxFillOps = 4096;
// A result the kernel takes completes at once; one still unsent after this long waits in
// rank 0's write queue until rank 1 reads.
constexpr int64_t kQueuedMs = 250;

std::string post_bulk(Peer& victim, const std::vector<float>& in, std::vector<float>* out,
                      std::shared_ptr<RequestState>* request) {
  PostArgs a;
  a.name = kBulk;
  a.send = in.data();
  a.recv = out->data();
  a.count = in.size();
  auto posted = victim.post(std::move(a));
  if (!posted.is_ok()) return "post: " + posted.status().message();
  *request = posted.value();
  return {};
}

// Rank 1's Ready and input for `version` of the bulk op, from rank 0's Ready for an
// earlier version (the versions differ in nothing else).
std::vector<uint8_t> bulk_from_member(const Frame& ready, uint64_t version,
                                      const std::vector<uint8_t>& input) {
  Frame r = ready;
  r.header.op_version = version;
  return concat({member_ready(r), frame(member_data(r.header), kBulk, input)});
}

// One bulk op, read to the end: *ready gets rank 0's Ready, the header of rank 1's frames
// for later versions.
std::string first_bulk(Peer& victim, FakeMember& fake, const std::vector<float>& in,
                       std::vector<float>* out, Frame* ready) {
  std::shared_ptr<RequestState> request;
  std::string wrong = post_bulk(victim, in, out, &request);
  if (!wrong.empty()) return wrong;
  const uint64_t v = request->version();
  Status s = fake.await(MsgType::Ready, kBulk, v, after_ms(kBoundMs), ready);
  if (!s.is_ok()) return "no Ready from rank 0: " + s.message();
  if (!fake.send(bulk_from_member(*ready, v, bytes_of(in.data(), in.size())))) return "rank 0 closed the link";
  if (!request->wait_for(kBoundMs, &s)) return "the first bulk op did not end within 10 s";
  if (!s.is_ok()) return "the first bulk op failed: " + s.message();
  Frame result;
  s = fake.await(MsgType::Data, kBulk, v, after_ms(kBoundMs), &result);
  if (!s.is_ok()) return "rank 0 sent no result: " + s.message();
  return {};
}

// Runs bulk ops while rank 1 reads nothing, until the socket buffers toward rank 1 are
// full and an op's result waits in rank 0's write queue; *stuck gets that op.
std::string fill_until_queued(Peer& victim, FakeMember& fake, const Frame& ready,
                              const std::vector<float>& in, std::vector<float>* out,
                              std::shared_ptr<RequestState>* stuck, int* ops) {
  const std::vector<uint8_t> input = bytes_of(in.data(), in.size());
  for (*ops = 0; *ops < kMaxFillOps; ++*ops) {
    std::shared_ptr<RequestState> request;
    std::string wrong = post_bulk(victim, in, out, &request);
    if (!wrong.empty()) return wrong;
    if (!fake.send(bulk_from_member(ready, request->version(), input))) return "rank 0 closed the link";
    Status s;
    if (!request->wait_for(kQueuedMs, &s)) {
      *stuck = request;
      return {};
    }
    if (!s.is_ok()) return "bulk op failed: " + s.message();
  }
  return "the socket buffers took " + std::to_string(kMaxFillOps) + " results without filling";
}

std::atomic<int> sigpipes{0};
void count_sigpipe(int) { sigpipes.fetch_add(1); }

}  // namespace

TEST_CASE("member: the fake rank 1 completes a valid allreduce", "[member]") {
  LogCapture log;
  std::string error;
  Rendezvous rv = start_rendezvous(&error);
  REQUIRE(error.empty());
  std::array<float, 2> out{};
  FakeMember fake;
  std::unique_ptr<Peer> victim;
  error = start_with_fake(base_config(0, rv.address, "wire-member-valid"), "", &fake, &victim);
  INFO(error);
  REQUIRE(error.empty());
  for (int i = 0; i < 3; ++i) {
    error = valid_allreduce(*victim, fake, &out);
    INFO(error);
    REQUIRE(error.empty());
  }
  CHECK(log.take().empty());
}

TEST_CASE("member: faults inside a well-formed frame fail the op and keep the link", "[member]") {
  for (const OpFault& f : op_faults()) {
    DYNAMIC_SECTION(f.what) {
      LogCapture log;
      std::string error;
      Rendezvous rv = start_rendezvous(&error);
      REQUIRE(error.empty());
      std::array<float, 2> out{};
      FakeMember fake;
      std::unique_ptr<Peer> victim;
      error = start_with_fake(base_config(0, rv.address, "wire-member"), "", &fake, &victim);
      INFO(error);
      REQUIRE(error.empty());
      size_t before = 0;
      auto start = Clock::now();
      for (int i = 0; i < kWarmup + kRepeats; ++i) {
        if (i == kWarmup) {
          before = resident_bytes();
          start = Clock::now();
        }
        std::string wrong = op_fault_once(*victim, fake, log, f, &out);
        INFO("repeat " << i << ": " << wrong);
        REQUIRE(wrong.empty());
      }
      const double seconds = ms_between(start, Clock::now()) / 1000;
      const size_t after = resident_bytes();
      error = valid_allreduce(*victim, fake, &out);
      INFO("rank 0 after the faults: " << error);
      CHECK(error.empty());
      CHECK(victim->async_error().is_ok());
      auto t0 = Clock::now();
      victim.reset();
      const double destroy_ms = ms_between(t0, Clock::now());
      std::printf("wire member: %-42s %d in %5.2f s, RSS %+.0f KiB, destroyed in %.1f ms\n",
                  f.what.c_str(), kRepeats, seconds,
                  (static_cast<double>(after) - static_cast<double>(before)) / 1024, destroy_ms);
      CHECK(after < before + 2 * kMiB);
      CHECK(destroy_ms < 5000);
      // A destroyed peer says goodbye: rank 1 reads the rest, then EOF.
      CHECK(fake.socket().wait_closed(after_ms(kBoundMs)) != RawSocket::Closed::StillOpen);
    }
  }
}

TEST_CASE("member: frames the header check refuses close the link to rank 1", "[member]") {
  for (const LinkFault& f : link_faults()) {
    DYNAMIC_SECTION(f.what) {
      LogCapture log;
      std::string error;
      Rendezvous rv = start_rendezvous(&error);
      REQUIRE(error.empty());
      int runs = 0;
      double slowest_destroy = 0;
      auto start = Clock::now();
      // A fresh rank 0 each time: as many as fit the time budget, at most kRepeats.
      while (runs < kRepeats && ms_between(start, Clock::now()) < kLinkCaseSeconds * 1000) {
        LinkRun r = link_fault_once(rv, "wire-link-" + std::to_string(runs), log, f);
        INFO("run " << runs << ": " << r.wrong);
        REQUIRE(r.wrong.empty());
        slowest_destroy = std::max(slowest_destroy, r.destroy_ms);
        ++runs;
      }
      std::printf("wire member: %-42s %d fresh peers in %5.2f s, destroyed within %.1f ms\n",
                  f.what.c_str(), runs, ms_between(start, Clock::now()) / 1000, slowest_destroy);
      CHECK(slowest_destroy < 5000);
    }
  }
}

TEST_CASE("member: a waiter running the loop writes to a closed link without SIGPIPE", "[member]") {
  // Counted instead of killing the test binary, as it would under the default disposition.
  struct sigaction counting = {};
  struct sigaction before = {};
  counting.sa_handler = count_sigpipe;
  sigemptyset(&counting.sa_mask);
  sigaction(SIGPIPE, &counting, &before);
  const int sigpipes_before = sigpipes.load();
  LogCapture log;
  std::string error;
  Rendezvous rv = start_rendezvous(&error);
  REQUIRE(error.empty());
  // A long spin window parks rank 0's I/O thread for a quarter of a second once this
  // thread, waiting, has run the loop and given it back: so the waits below, not the I/O
  // thread, are the first to touch the closed link (the first write draws a reset, the
  // next fails with EPIPE, which raises SIGPIPE in the writing thread unless blocked).
  Config config = base_config(0, rv.address, "wire-member-sigpipe");
  config.progress = "adaptive";
  config.spin_us = 1000000;
  std::array<float, 2> out{};
  FakeMember fake;
  std::unique_ptr<Peer> victim;
  error = start_with_fake(config, "", &fake, &victim);
  INFO(error);
  REQUIRE(error.empty());
  for (int i = 0; i < 2; ++i) {
    error = valid_allreduce(*victim, fake, &out);
    INFO(error);
    REQUIRE(error.empty());
  }
  fake.socket().close();
  std::array<std::array<float, 2>, 3> outs{};
  std::vector<std::shared_ptr<RequestState>> requests;
  for (auto& o : outs) {
    PostArgs args;
    args.name = kOp;
    args.send = kMine.data();
    args.recv = o.data();
    args.count = o.size();
    auto posted = victim->post(args);
    REQUIRE(posted.is_ok());
    requests.push_back(posted.value());
  }
  for (auto& request : requests) {
    Status s;
    REQUIRE(request->wait_for(kBoundMs, &s));
    CHECK(s.code() == Code::PeerLost);
  }
  victim.reset();
  CHECK(sigpipes.load() == sigpipes_before);
  sigaction(SIGPIPE, &before, nullptr);
}

TEST_CASE("member: a rank leaving with data queued says Bye after it and sends nothing more", "[member]") {
  LogCapture log;
  std::string error;
  Rendezvous rv = start_rendezvous(&error);
  REQUIRE(error.empty());
  const std::string job = "wire-member-bye";
  FakeMember fake;
  std::unique_ptr<Peer> victim;
  error = start_with_fake(base_config(0, rv.address, job), "", &fake, &victim);
  INFO(error);
  REQUIRE(error.empty());
  const std::vector<float> in(kBulkCount, 1.0f);
  std::vector<float> out(kBulkCount);
  Frame ready;
  error = first_bulk(*victim, fake, in, &out, &ready);
  INFO(error);
  REQUIRE(error.empty());
  auto start = Clock::now();
  std::shared_ptr<RequestState> stuck;
  int ops = 0;
  error = fill_until_queued(*victim, fake, ready, in, &out, &stuck, &ops);
  INFO(error);
  REQUIRE(error.empty());
  // Rank 0 leaves: destroyed, it aborts the stuck op at once (finalize would wait out its
  // deadline) and closes with a Bye, queued behind the stuck result; the link drains once
  // rank 1 reads.
  auto left = std::async(std::launch::async, [&victim] { victim.reset(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the Bye is queued
  // A stalled op's watchdog asks. Rank 0 still reads while it drains, and answers with so
  // little queued; an Answer written behind its Bye would fail on the shut write side and
  // drop the link before the queued result and the Bye are out.
  FrameHeader query = ready.header;
  query.type = MsgType::Query;
  query.src_rank = 1;
  query.op_version = stuck->version();
  REQUIRE(fake.send(frame(query, kBulk)));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // handled before rank 1 reads
  Frame bye;
  Status s = fake.await(MsgType::Bye, job, 0, after_ms(kBoundMs), &bye);
  INFO("rank 0 closed the link without a Bye: " << s.message());
  CHECK(s.is_ok());
  CHECK(fake.socket().wait_closed(after_ms(kBoundMs)) == RawSocket::Closed::Eof);
  REQUIRE(stuck->wait_for(kBoundMs, &s));
  CHECK(s.code() == Code::Aborted);
  REQUIRE(left.wait_for(std::chrono::milliseconds(kBoundMs)) == std::future_status::ready);
  std::printf("wire member: %-42s %d results filled the buffers, done in %5.2f s\n",
              "Bye behind queued data", ops, ms_between(start, Clock::now()) / 1000);
  CHECK(log.take().empty());
}
