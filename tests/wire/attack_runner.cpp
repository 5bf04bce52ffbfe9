#include "attack_runner.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>

namespace wire {

AttackedPair::AttackedPair(const PairOptions& options) {
  std::string error;
  rendezvous_ = start_rendezvous(&error);
  REQUIRE(error.empty());
  taiji::Config c[2];
  for (int r = 0; r < 2; ++r) {
    taiji::Config e = base_config(r, rendezvous_.address, kJob);
    e.handshake_timeout_ms = options.handshake_ms;
    e.max_pending_connections = options.max_pending;
    e.max_name_len = kMaxNameLen;
    e.max_payload = kMaxPayload;
    e.secret_file = options.secret_file;
    auto resolved = resolve(e);
    INFO(resolved.status().message());
    REQUIRE(resolved.is_ok());
    c[r] = resolved.value();
  }
  error = start_pair(c[0], c[1], &pair_);
  INFO(error);
  REQUIRE(error.empty());
  log_.take();
}

std::string AttackedPair::healthy(const std::string& op_name) {
  std::string wrong = check_allreduce(*pair_.peer[0], *pair_.peer[1], op_name, ++round_);
  if (wrong.empty() && !pair_.peer[0]->async_error().is_ok()) {
    wrong = "rank 0 has an error: " + pair_.peer[0]->async_error().message();
  }
  return wrong;
}

taiji::FrameHeader hello_header(uint32_t src) {
  taiji::FrameHeader h;
  h.type = taiji::MsgType::Hello;
  h.src_rank = src;
  h.cluster_version = kClusterVersion;
  return h;
}

std::vector<uint8_t> hello(const std::string& job, uint32_t src, std::vector<uint8_t> payload) {
  return frame(hello_header(src), job, payload);
}

std::vector<uint8_t> garbage(size_t n) { return std::vector<uint8_t>(n, 0xA5); }

namespace {

struct BatchResult {
  std::string wrong;      // empty when every connection was closed as expected
  double slowest_ms = 0;  // connect to close
  double fastest_ms = 1e9;
};

// Opens n connections to rank 0, attacks each, and waits until rank 0 closed them all;
// then checks the log holds exactly one line per connection.
BatchResult attack_batch(AttackedPair& f, const Attack& a, int n) {
  BatchResult r;
  std::vector<RawSocket> socks(n);
  std::vector<Clock::time_point> opened(n);
  for (int i = 0; i < n; ++i) {
    std::string error;
    opened[i] = Clock::now();
    socks[i] = RawSocket::connect_to(f.target(), &error);
    if (!socks[i].valid()) return {error};
    // The peer may close before all bytes are in (it stops at the first bad field).
    socks[i].send_all(a.bytes);
    if (a.half_close) socks[i].shutdown_write();
  }
  for (int i = 0; a.converse && i < n; ++i) {
    r.wrong = a.converse(socks[i]);
    if (!r.wrong.empty()) return r;
  }
  auto deadline = after_ms(kCloseBoundMs + kHandshakeMs);
  for (int i = 0; i < n; ++i) {
    RawSocket::Closed c = socks[i].wait_closed(deadline);
    double ms = ms_between(opened[i], Clock::now());
    r.slowest_ms = std::max(r.slowest_ms, ms);
    r.fastest_ms = std::min(r.fastest_ms, ms);
    if (c == RawSocket::Closed::StillOpen) {
      r.wrong = "connection " + std::to_string(i) + " still open after " + std::to_string(ms) + " ms";
      return r;
    }
  }
  r.wrong = expect_refusals(f.take_log(static_cast<size_t>(n)), static_cast<size_t>(n), a.cause);
  return r;
}

}  // namespace

void repeat_attack(AttackedPair& f, const Attack& a, int batch, double min_close_ms) {
  INFO("attack: " << a.what);
  BatchResult warm = attack_batch(f, a, batch);
  INFO(warm.wrong);
  REQUIRE(warm.wrong.empty());
  REQUIRE(f.healthy().empty());
  const size_t before = resident_bytes();
  auto start = Clock::now();
  double slowest = 0;
  double fastest = 1e9;
  for (int done = 0; done < kRepeats; done += batch) {
    BatchResult r = attack_batch(f, a, std::min(batch, kRepeats - done));
    INFO("after " << done << " repeats: " << r.wrong);
    REQUIRE(r.wrong.empty());
    slowest = std::max(slowest, r.slowest_ms);
    fastest = std::min(fastest, r.fastest_ms);
    std::string sick = f.healthy();
    INFO("real peers after " << done << " repeats: " << sick);
    REQUIRE(sick.empty());
  }
  const size_t after = resident_bytes();
  std::printf("wire attacker: %-58s %d in %5.2f s, closed after %.1f..%.1f ms, RSS %+.0f KiB\n",
              a.what.c_str(), kRepeats, ms_between(start, Clock::now()) / 1000, fastest, slowest,
              (static_cast<double>(after) - static_cast<double>(before)) / 1024);
  CHECK(fastest >= min_close_ms);
  CHECK(after < before + 2 * kMiB);
}

}  // namespace wire
