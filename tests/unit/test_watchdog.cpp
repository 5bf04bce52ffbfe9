// The stall watchdog: an op some peers posted and others did not is logged, after the
// configured time, with its name and the ranks missing. Real peers on loopback, built from
// the internal classes so the test can read the library's log.
#include <catch2/catch.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "monitor/log.h"
#include "runtime/peer.h"

using namespace taiji;

namespace {

// Captures the library's log lines for the life of the object.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)) {
    sink_->set_pattern("%v");
    log().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = log().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  int count(const std::string& needle) const {
    int n = 0;
    for (const std::string& line : sink_->last_formatted()) n += line.find(needle) != std::string::npos;
    return n;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

// Three peers allreduce "late" once; rank 2 posts it `delay_ms` after the others, or
// (grouped) at once but inside a group it ends `delay_ms` later.
void run_late_allreduce(int64_t stall_warn_ms, int delay_ms, bool grouped = false) {
  auto server = RendezvousServer::start("127.0.0.1", 0);
  REQUIRE(server.is_ok());
  const std::string address = "127.0.0.1:" + std::to_string(server.value()->port());
  constexpr int kPeers = 3;
  std::vector<std::string> failures(kPeers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kPeers; ++r) {
    threads.emplace_back([&, r] {
      Config c;
      c.rank = r;
      c.size = kPeers;
      c.rendezvous = address;
      c.host_rendezvous = 0;
      c.job_id = "watchdog";
      c.timeout_ms = 20000;
      c.init_timeout_ms = 20000;
      c.stall_warn_ms = stall_warn_ms;
      auto config = resolve_config(c, [](const char*) -> const char* { return nullptr; });
      if (!config.is_ok()) return void(failures[r] = config.status().message());
      auto peer = Peer::create(config.value());
      if (!peer.is_ok()) return void(failures[r] = peer.status().message());
      if (r == 2 && !grouped) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      if (r == 2 && grouped) peer.value()->group_start();
      std::vector<int32_t> send(16, r + 1);
      std::vector<int32_t> recv(16, 0);
      PostArgs args;
      args.kind = OpKind::Allreduce;
      args.name = "late";
      args.send = send.data();
      args.recv = recv.data();
      args.count = send.size();
      args.dtype = DType::I32;
      auto req = peer.value()->post(std::move(args));
      if (!req.is_ok()) return void(failures[r] = req.status().message());
      if (r == 2 && grouped) {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        Status ended = peer.value()->group_end();
        if (!ended.is_ok()) return void(failures[r] = "group_end: " + ended.message());
      }
      Status s;
      if (!req.value()->wait_for(20000, &s)) return void(failures[r] = "allreduce did not finish");
      if (!s.is_ok()) return void(failures[r] = s.message());
      for (int32_t v : recv) {
        if (v != 1 + 2 + 3) return void(failures[r] = "wrong sum " + std::to_string(v));
      }
      Status fin = peer.value()->finalize();
      if (!fin.is_ok()) failures[r] = "finalize: " + fin.message();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kPeers; ++r) {
    CAPTURE(r);
    INFO(failures[r]);
    CHECK(failures[r].empty());
  }
}

}  // namespace

TEST_CASE("watchdog: a stalled op is logged with the ranks that have not posted it", "[watchdog]") {
  LogCapture capture;
  run_late_allreduce(200, 1500);
  // Ranks 0 and 1 each asked every rank and each logged the same finding once.
  CHECK(capture.count("stall: allreduce 'late' version 1 posted here") == 2);
  CHECK(capture.count("rank(s) 2 have not posted it") == 2);
}

TEST_CASE("watchdog: an op held in an open group counts as not posted", "[watchdog]") {
  LogCapture capture;
  run_late_allreduce(200, 1500, true);
  CHECK(capture.count("stall: allreduce 'late' version 1 posted here") == 2);
  CHECK(capture.count("rank(s) 2 have not posted it") == 2);
}

TEST_CASE("watchdog: off when the stall time is 0, quiet when nothing stalls", "[watchdog]") {
  SECTION("off") {
    LogCapture capture;
    run_late_allreduce(0, 600);
    CHECK(capture.count("stall:") == 0);
  }
  SECTION("no stall within the time") {
    LogCapture capture;
    run_late_allreduce(5000, 0);
    CHECK(capture.count("stall:") == 0);
  }
}
