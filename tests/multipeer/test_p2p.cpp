// Point-to-point (taiji_send / taiji_recv): a send meets the recv of the same name and
// version on its destination and nothing else; automatic versions count per pair and
// direction; large messages go in chunks over TCP and shared memory; a ring exchange in
// one group does not deadlock; disagreements, deadlines, bad arguments and a departed
// peer fail with the documented errors and lose nothing.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

bool await_flag(const std::atomic<bool>& flag, std::chrono::milliseconds limit) {
  auto deadline = Clock::now() + limit;
  while (!flag.load() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return flag.load();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string last_error(taiji_peer_t* peer) { return taiji_peer_last_error(peer); }

// What rank `from` sends to rank `to` under `name`: bytes no other pair or name shares.
std::vector<uint8_t> payload(const std::string& name, int from, int to, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  fill_bytes(salt_of(name + "/" + std::to_string(from) + ">" + std::to_string(to)), v.data(), bytes);
  return v;
}

// Checks a received buffer against what the sender sent, and the guard behind it.
void check_received(Failures& failures, int rank, const std::string& what, GuardedBuffer& got,
                    const std::vector<uint8_t>& want) {
  if (!failures.expect(rank, got.guard_intact(), what + ": wrote past the buffer")) return;
  if (std::memcmp(got.data(), want.data(), want.size()) == 0) return;
  size_t i = 0;
  while (got.data()[i] == want[i]) ++i;
  failures.add(rank, what + ": byte " + std::to_string(i) + " of " + std::to_string(want.size()) + " differs");
}

// Waits for a request, frees it and checks its status (and its version, when want_version > 0).
void finish(taiji_peer_t* peer, taiji_request_t* req, Failures& failures, int rank, const std::string& what,
            taiji_status_t want, uint64_t want_version = 0) {
  if (req == nullptr) return;
  const uint64_t version = taiji_request_version(req);
  taiji_status_t s = wait_bounded(peer, req, 30000, failures, rank, what);
  if (!failures.expect_status(rank, what, s, want)) {
    failures.add(rank, what + ": " + taiji_request_error(req));
  }
  taiji_request_free(req);
  if (want_version != 0) {
    failures.expect(rank, version == want_version,
                    what + ": version " + std::to_string(version) + ", want " + std::to_string(want_version));
  }
}

// Waits (at most 20 s) until reads from `from` have paused at least once.
bool await_read_pause(taiji_peer_t* peer, int from) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline) {
    const uint64_t pauses = metric_value(peer, "read_pauses", from);
    if (pauses != UINT64_MAX && pauses > 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace

TEST_CASE("p2p: every dtype arrives exactly, blocking and async, with callbacks", "[p2p]") {
  Failures failures;
  failures.add_all(run_peers(2, [&](taiji_peer_t* peer, int rank) {
    const int other = 1 - rank;
    for (taiji_dtype_t dtype : kAllDtypes) {
      const size_t count = 1000 + static_cast<size_t>(dtype);
      const size_t bytes = count * dtype_size(dtype);
      // Rank 0 sends blocking and receives async; rank 1 the other way round.
      for (int sender = 0; sender < 2; ++sender) {
        const std::string name = std::string("dtype/") + dtype_name(dtype) + "/" + std::to_string(sender);
        const std::vector<uint8_t> sent = payload(name, sender, 1 - sender, bytes);
        const bool blocking = rank == 0;
        taiji_op_options_t opt = op_options();
        CallbackLog log;
        if (!blocking) {
          opt.callback = record_callback;
          opt.user_data = &log;
        }
        taiji_request_t* req = nullptr;
        GuardedBuffer got(bytes);
        if (rank == sender) {
          failures.expect_status(rank, "send " + name,
                                 taiji_send(peer, name.c_str(), sent.data(), count, dtype, other, &opt,
                                            blocking ? nullptr : &req),
                                 TAIJI_OK);
        } else {
          failures.expect_status(rank, "recv " + name,
                                 taiji_recv(peer, name.c_str(), got.data(), count, dtype, other, &opt,
                                            blocking ? nullptr : &req),
                                 TAIJI_OK);
        }
        finish(peer, req, failures, rank, name, TAIJI_OK, 1);
        if (!blocking) {
          failures.expect(rank, await_calls(log, 1, std::chrono::milliseconds(5000)),
                          name + ": callback ran " + std::to_string(log.calls.load()) + " times");
          failures.expect_status(rank, name + " callback", static_cast<taiji_status_t>(log.status.load()), TAIJI_OK);
        }
        if (rank != sender) check_received(failures, rank, name, got, sent);
      }
    }
  }));
  check_no_failures(failures);
}

TEST_CASE("p2p: a recv posted before its send and after it both meet it", "[p2p]") {
  // Small messages travel eagerly (and may wait at the receiver); large ones wait for the
  // receiver's Ready.
  const size_t bytes = GENERATE(size_t{100}, size_t{3} << 20);
  CAPTURE(bytes);
  Failures failures;
  std::atomic<bool> recv_posted{false};
  std::atomic<bool> send_posted{false};
  failures.add_all(run_peers(2, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options();
    const std::vector<uint8_t> a = payload("order/recv-first", 0, 1, bytes);
    const std::vector<uint8_t> b = payload("order/send-first", 0, 1, bytes);
    if (rank == 1) {
      GuardedBuffer got(bytes);
      taiji_request_t* req = nullptr;
      failures.expect_status(rank, "recv first",
                             taiji_recv(peer, "order/recv-first", got.data(), bytes, TAIJI_U8, 0, &opt, &req),
                             TAIJI_OK);
      recv_posted.store(true);
      finish(peer, req, failures, rank, "recv first", TAIJI_OK, 1);
      check_received(failures, rank, "recv first", got, a);
      // The send is posted and its eager data (if small) is here before this recv.
      failures.expect(rank, await_flag(send_posted, std::chrono::seconds(20)), "rank 0 never sent");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      GuardedBuffer late(bytes);
      failures.expect_status(rank, "recv after",
                             taiji_recv(peer, "order/send-first", late.data(), bytes, TAIJI_U8, 0, &opt, nullptr),
                             TAIJI_OK);
      check_received(failures, rank, "recv after", late, b);
    } else {
      failures.expect(rank, await_flag(recv_posted, std::chrono::seconds(20)), "rank 1 never posted its recv");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      failures.expect_status(rank, "send after",
                             taiji_send(peer, "order/recv-first", a.data(), bytes, TAIJI_U8, 1, &opt, nullptr),
                             TAIJI_OK);
      taiji_request_t* req = nullptr;
      failures.expect_status(rank, "send first",
                             taiji_send(peer, "order/send-first", b.data(), bytes, TAIJI_U8, 1, &opt, &req),
                             TAIJI_OK);
      send_posted.store(true);
      finish(peer, req, failures, rank, "send first", TAIJI_OK, 1);
    }
  }));
  check_no_failures(failures);
}

TEST_CASE("p2p: automatic versions count per name, direction and other rank", "[p2p]") {
  constexpr int n = 3;
  constexpr size_t bytes = 64;
  Failures failures;
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options();
    // Rank 0 sends "x" twice to rank 1 and twice to rank 2, then receives one "x" from each.
    // Every pair's and direction's first "x" is version 1, its second version 2.
    auto sent = [](int from, int to, int round) {
      return payload("x/" + std::to_string(round), from, to, bytes);
    };
    if (rank == 0) {
      std::vector<std::vector<uint8_t>> out;
      std::vector<taiji_request_t*> reqs;
      std::vector<uint64_t> want;
      for (int round = 1; round <= 2; ++round) {
        for (int to = 1; to < n; ++to) {
          out.push_back(sent(0, to, round));
          reqs.push_back(nullptr);
          want.push_back(static_cast<uint64_t>(round));
          failures.expect_status(rank, "send x",
                                 taiji_send(peer, "x", out.back().data(), bytes, TAIJI_U8, to, &opt, &reqs.back()),
                                 TAIJI_OK);
        }
      }
      for (size_t k = 0; k < reqs.size(); ++k) {
        finish(peer, reqs[k], failures, rank, "send x #" + std::to_string(k), TAIJI_OK, want[k]);
      }
      for (int from = 1; from < n; ++from) {
        GuardedBuffer got(bytes);
        taiji_request_t* req = nullptr;
        failures.expect_status(rank, "recv x", taiji_recv(peer, "x", got.data(), bytes, TAIJI_U8, from, &opt, &req),
                               TAIJI_OK);
        finish(peer, req, failures, rank, "recv x from " + std::to_string(from), TAIJI_OK, 1);
        check_received(failures, rank, "recv x from " + std::to_string(from), got, sent(from, 0, 1));
      }
      return;
    }
    for (int round = 1; round <= 2; ++round) {
      GuardedBuffer got(bytes);
      taiji_request_t* req = nullptr;
      failures.expect_status(rank, "recv x", taiji_recv(peer, "x", got.data(), bytes, TAIJI_U8, 0, &opt, &req),
                             TAIJI_OK);
      const std::string what = "recv x round " + std::to_string(round);
      finish(peer, req, failures, rank, what, TAIJI_OK, static_cast<uint64_t>(round));
      check_received(failures, rank, what, got, sent(0, rank, round));
    }
    const std::vector<uint8_t> back = sent(rank, 0, 1);
    taiji_request_t* req = nullptr;
    failures.expect_status(rank, "send x back", taiji_send(peer, "x", back.data(), bytes, TAIJI_U8, 0, &opt, &req),
                           TAIJI_OK);
    finish(peer, req, failures, rank, "send x back", TAIJI_OK, 1);
  }));
  check_no_failures(failures);
}

TEST_CASE("p2p: several MiB in chunks, both ways at once, over TCP and shared memory", "[p2p]") {
  const char* shm = GENERATE("off", "auto");
  CAPTURE(shm);
  EnvOverride shm_env("TAIJI_SHM", shm);
  EnvOverride chunk("TAIJI_CHUNK_BYTES", "1M");
  // f64 and an odd byte count: chunks of unequal length, the last one short.
  constexpr size_t kF64 = (6u << 20) / 8 + 5;
  constexpr size_t kU8 = (5u << 20) + 3;
  Failures failures;
  failures.add_all(run_peers(2, [&](taiji_peer_t* peer, int rank) {
    const int other = 1 - rank;
    taiji_op_options_t opt = op_options(30000);
    const std::vector<uint8_t> out_f64 = payload("big/f64", rank, other, kF64 * 8);
    const std::vector<uint8_t> out_u8 = payload("big/u8", rank, other, kU8);
    GuardedBuffer in_f64(kF64 * 8);
    GuardedBuffer in_u8(kU8);
    taiji_request_t* reqs[4] = {};
    const char* what[4] = {"send f64", "recv f64", "recv u8", "send u8"};
    const taiji_status_t posted[4] = {
        taiji_send(peer, "big/f64", out_f64.data(), kF64, TAIJI_F64, other, &opt, &reqs[0]),
        taiji_recv(peer, "big/f64", in_f64.data(), kF64, TAIJI_F64, other, &opt, &reqs[1]),
        taiji_recv(peer, "big/u8", in_u8.data(), kU8, TAIJI_U8, other, &opt, &reqs[2]),
        taiji_send(peer, "big/u8", out_u8.data(), kU8, TAIJI_U8, other, &opt, &reqs[3]),
    };
    for (int k = 0; k < 4; ++k) failures.expect_status(rank, std::string("post ") + what[k], posted[k], TAIJI_OK);
    for (int k = 0; k < 4; ++k) finish(peer, reqs[k], failures, rank, what[k], TAIJI_OK, 1);
    check_received(failures, rank, "big/f64", in_f64, payload("big/f64", other, rank, kF64 * 8));
    check_received(failures, rank, "big/u8", in_u8, payload("big/u8", other, rank, kU8));
    const uint64_t shm_sent = metric_value(peer, "shm_bytes_sent", other);
    if (std::string(shm) == "off") {
      failures.expect(rank, shm_sent == 0, std::to_string(shm_sent) + " bytes through shared memory with it off");
    } else {
      failures.expect(rank, shm_sent != UINT64_MAX && shm_sent >= kU8,
                      "only " + std::to_string(shm_sent) + " bytes through shared memory");
    }
  }));
  check_no_failures(failures);
}

TEST_CASE("p2p: a ring exchange posted in one group does not deadlock", "[p2p]") {
  const int n = GENERATE(3, 4);
  CAPTURE(n);
  Failures failures;
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    const int next = (rank + 1) % n;
    const int prev = (rank + n - 1) % n;
    taiji_op_options_t opt = op_options();
    for (size_t bytes : {size_t{1000}, size_t{2} << 20}) {
      const std::string name = "ring/" + std::to_string(bytes);
      const std::vector<uint8_t> out = payload(name, rank, next, bytes);
      GuardedBuffer in(bytes);
      taiji_request_t* send = nullptr;
      taiji_request_t* recv = nullptr;
      failures.expect_status(rank, "group_start", taiji_group_start(peer), TAIJI_OK);
      // Every rank sends before it receives: one at a time, blocking, this would deadlock
      // as soon as the data waits for the receiver.
      failures.expect_status(rank, "send " + name,
                             taiji_send(peer, name.c_str(), out.data(), bytes, TAIJI_U8, next, &opt, &send),
                             TAIJI_OK);
      failures.expect_status(rank, "recv " + name,
                             taiji_recv(peer, name.c_str(), in.data(), bytes, TAIJI_U8, prev, &opt, &recv),
                             TAIJI_OK);
      failures.expect_status(rank, "test held send", send ? taiji_request_test(send) : TAIJI_IN_PROGRESS,
                             TAIJI_IN_PROGRESS);
      failures.expect_status(rank, "group_end", taiji_group_end(peer), TAIJI_OK);
      finish(peer, send, failures, rank, "send " + name, TAIJI_OK, 1);
      finish(peer, recv, failures, rank, "recv " + name, TAIJI_OK, 1);
      check_received(failures, rank, name, in, payload(name, prev, rank, bytes));
    }
  }));
  check_no_failures(failures);
}

TEST_CASE("p2p: a count or dtype disagreement fails both sides with ERR_MISMATCH", "[p2p]") {
  Failures failures;
  failures.add_all(run_peers(2, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options();
    struct Case {
      const char* name;
      size_t send_count, recv_count;
      taiji_dtype_t send_dtype, recv_dtype;
      const char *send_text, *recv_text;
    };
    const Case cases[] = {
        {"mm/count", 10, 20, TAIJI_I32, TAIJI_I32, "send count 10 i32", "recv count 20 i32"},
        {"mm/dtype", 10, 10, TAIJI_F32, TAIJI_I32, "send count 10 f32", "recv count 10 i32"},
        // Large: the sender holds its data for the receiver's Ready, which disagrees.
        {"mm/large", 1 << 20, (1 << 20) + 1, TAIJI_F32, TAIJI_F32, "send count 1048576 f32",
         "recv count 1048577 f32"},
    };
    std::vector<uint8_t> buf((size_t{4} << 20) + 64);
    for (const Case& c : cases) {
      taiji_request_t* req = nullptr;
      taiji_status_t s = rank == 0
                             ? taiji_send(peer, c.name, buf.data(), c.send_count, c.send_dtype, 1, &opt, &req)
                             : taiji_recv(peer, c.name, buf.data(), c.recv_count, c.recv_dtype, 0, &opt, &req);
      if (!failures.expect_status(rank, std::string("post ") + c.name, s, TAIJI_OK)) continue;
      s = wait_bounded(peer, req, 20000, failures, rank, c.name);
      const std::string error = taiji_request_error(req);
      taiji_request_free(req);
      failures.expect_status(rank, c.name, s, TAIJI_ERR_MISMATCH);
      // The side that found the disagreement names both posts; the other hears it.
      for (const char* part : {c.send_text, c.recv_text, "rank 0", "rank 1"}) {
        failures.expect(rank, contains(error, part), std::string(c.name) + ": error lacks '" + part + "': " + error);
      }
      failures.expect(rank, contains(error, std::string("'") + c.name + "'"), std::string(c.name) + ": " + error);
    }
    // The pair goes on.
    const std::vector<uint8_t> sent = payload("mm/after", 0, 1, 32);
    GuardedBuffer got(32);
    taiji_status_t s = rank == 0 ? taiji_send(peer, "mm/after", sent.data(), 32, TAIJI_U8, 1, &opt, nullptr)
                                 : taiji_recv(peer, "mm/after", got.data(), 32, TAIJI_U8, 0, &opt, nullptr);
    failures.expect_status(rank, "after the mismatches", s, TAIJI_OK);
    if (rank == 1) check_received(failures, rank, "mm/after", got, sent);
  }));
  check_no_failures(failures);
}

TEST_CASE("p2p: a side whose partner never posts times out on its deadline, saying why", "[p2p]") {
  Failures failures;
  failures.add_all(run_peers(2, [&](taiji_peer_t* peer, int rank) {
    std::vector<uint8_t> buf(size_t{1} << 20);
    // Small (eager) and large (waiting for the Ready that never comes) sends.
    for (size_t bytes : {size_t{16}, buf.size()}) {
      const std::string name = (rank == 0 ? "lonely/send/" : "lonely/recv/") + std::to_string(bytes);
      taiji_op_options_t opt = op_options(300);
      const auto start = Clock::now();
      taiji_status_t s = rank == 0 ? taiji_send(peer, name.c_str(), buf.data(), bytes, TAIJI_U8, 1, &opt, nullptr)
                                   : taiji_recv(peer, name.c_str(), buf.data(), bytes, TAIJI_U8, 0, &opt, nullptr);
      const double took = ms_since(start);
      const std::string error = last_error(peer);
      failures.expect_status(rank, name, s, TAIJI_ERR_TIMEOUT);
      failures.expect(rank, took >= 250 && took < 5000, name + ": timed out after " + std::to_string(took) + " ms");
      const std::string title = rank == 0 ? "send '" + name + "' version 1 to rank 1 timed out after 300 ms"
                                          : "recv '" + name + "' version 1 from rank 0 timed out after 300 ms";
      failures.expect(rank, contains(error, title), name + ": " + error);
      const std::string why = rank == 0 ? "rank(s) 1 never posted it" : "waiting here for data from rank(s) 0";
      failures.expect(rank, contains(error, why), name + ": " + error);
    }
    // Both go on.
    taiji_op_options_t opt = op_options();
    failures.expect_status(rank, "barrier after", taiji_barrier(peer, "lonely/after", &opt, nullptr), TAIJI_OK);
  }));
  check_no_failures(failures);
}

TEST_CASE("p2p: bad arguments fail at once with ERR_INVALID_ARGUMENT and post nothing", "[p2p]") {
  Failures failures;
  failures.add_all(run_peers(2, [&](taiji_peer_t* peer, int rank) {
    const int other = 1 - rank;
    taiji_op_options_t opt = op_options();
    uint8_t buf[8] = {};
    // Each call is refused, hands out no request and says why in the last error.
    auto refused = [&](const std::string& what, taiji_status_t got, taiji_request_t* req, const std::string& text) {
      failures.expect_status(rank, what, got, TAIJI_ERR_INVALID_ARGUMENT);
      failures.expect(rank, req == nullptr, what + ": a request was handed out");
      failures.expect(rank, contains(last_error(peer), text), what + ": last error: " + last_error(peer));
    };
    auto both = [&](const std::string& what, const char* name, void* b, size_t count, taiji_dtype_t dtype, int r,
                    const std::string& text, bool blocking = false) {
      taiji_request_t* req = nullptr;
      taiji_request_t** out = blocking ? nullptr : &req;
      refused("send " + what, taiji_send(peer, name, b, count, dtype, r, &opt, out), req, text);
      refused("recv " + what, taiji_recv(peer, name, b, count, dtype, r, &opt, out), req, text);
    };
    both("to its own rank", "inv", buf, 8, TAIJI_U8, rank, "own rank");
    both("to rank -1", "inv", buf, 8, TAIJI_U8, -1, "is not a rank of this 2-peer job");
    both("to rank 2", "inv", buf, 8, TAIJI_U8, 2, "is not a rank of this 2-peer job");
    both("with a NULL buffer", "inv", nullptr, 8, TAIJI_U8, other, "buffer is NULL");
    both("with a reserved name", "taiji.inv", buf, 8, TAIJI_U8, other, "reserved");
    both("with a NULL name", nullptr, buf, 8, TAIJI_U8, other, "name is NULL");
    both("with an empty name", "", buf, 8, TAIJI_U8, other, "empty");
    // Past the last dtype, yet inside the enum's range (a C++ caller cannot pass more).
    both("with a bad dtype", "inv", buf, 8, static_cast<taiji_dtype_t>(99), other, "dtype");
    taiji_op_options_t with_stats = opt;
    with_stats.grad_stats = reinterpret_cast<taiji_grad_stats_t*>(buf);
    taiji_request_t* req = nullptr;
    refused("send with grad_stats", taiji_send(peer, "inv", buf, 8, TAIJI_U8, other, &with_stats, &req), req,
            "allreduce only");
    failures.expect_status(rank, "group_start", taiji_group_start(peer), TAIJI_OK);
    both("blocking inside a group", "inv", buf, 8, TAIJI_U8, other, "inside an open group", true);
    failures.expect_status(rank, "group_end", taiji_group_end(peer), TAIJI_OK);
    failures.expect_status(rank, "NULL peer", taiji_send(nullptr, "inv", buf, 8, TAIJI_U8, other, &opt, nullptr),
                           TAIJI_ERR_INVALID_ARGUMENT);
    // Nothing was posted: the first real "inv" each way is version 1. A NULL buffer with
    // a count of 0 is fine.
    const std::vector<uint8_t> sent = payload("inv", rank, other, 8);
    taiji_request_t* reqs[4] = {};
    GuardedBuffer got(8);
    const char* what[4] = {"send inv", "recv inv", "send empty", "recv empty"};
    const taiji_status_t posted[4] = {
        taiji_send(peer, "inv", sent.data(), 8, TAIJI_U8, other, &opt, &reqs[0]),
        taiji_recv(peer, "inv", got.data(), 8, TAIJI_U8, other, &opt, &reqs[1]),
        taiji_send(peer, "empty", nullptr, 0, TAIJI_F32, other, &opt, &reqs[2]),
        taiji_recv(peer, "empty", nullptr, 0, TAIJI_F32, other, &opt, &reqs[3]),
    };
    for (int k = 0; k < 4; ++k) failures.expect_status(rank, std::string("post ") + what[k], posted[k], TAIJI_OK);
    for (int k = 0; k < 4; ++k) finish(peer, reqs[k], failures, rank, what[k], TAIJI_OK, 1);
    check_received(failures, rank, "inv", got, payload("inv", other, rank, 8));
  }));
  check_no_failures(failures);
}

TEST_CASE("p2p: a collective and a send of the same name do not meet", "[p2p]") {
  Failures failures;
  failures.add_all(run_peers(2, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options();
    constexpr size_t count = 256;
    std::vector<int32_t> in(count), out(count, -1);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(i * 3 + static_cast<size_t>(rank));
    const std::vector<uint8_t> sent = payload("same", 0, 1, count * 4);
    GuardedBuffer got(count * 4);
    taiji_request_t* allreduce = nullptr;
    taiji_request_t* p2p = nullptr;
    // Rank 0 posts the send first, rank 1 the allreduce: had they shared a name space,
    // each would take the other's frames for its own op's.
    if (rank == 0) {
      failures.expect_status(rank, "send", taiji_send(peer, "same", sent.data(), count, TAIJI_I32, 1, &opt, &p2p),
                             TAIJI_OK);
      failures.expect_status(rank, "allreduce",
                             taiji_allreduce(peer, "same", in.data(), out.data(), count, TAIJI_I32, TAIJI_SUM, &opt,
                                             &allreduce),
                             TAIJI_OK);
    } else {
      failures.expect_status(rank, "allreduce",
                             taiji_allreduce(peer, "same", in.data(), out.data(), count, TAIJI_I32, TAIJI_SUM, &opt,
                                             &allreduce),
                             TAIJI_OK);
      failures.expect_status(rank, "recv", taiji_recv(peer, "same", got.data(), count, TAIJI_I32, 0, &opt, &p2p),
                             TAIJI_OK);
    }
    finish(peer, allreduce, failures, rank, "allreduce same", TAIJI_OK, 1);
    finish(peer, p2p, failures, rank, "p2p same", TAIJI_OK, 1);
    for (size_t i = 0; i < count; ++i) {
      const int32_t want = static_cast<int32_t>(2 * i * 3 + 1);
      if (out[i] != want) {
        failures.add(rank, "allreduce element " + std::to_string(i) + " is " + std::to_string(out[i]));
        break;
      }
    }
    if (rank == 1) check_received(failures, rank, "recv same", got, sent);
  }));
  check_no_failures(failures);
}

TEST_CASE("p2p: a sender far ahead of its receiver is throttled, and everything arrives", "[p2p]") {
  // 200 sends of 16 KiB against 128 KiB of early-arrival space at the receiver.
  EnvOverride cap("TAIJI_UNEXPECTED_BYTES", "128K");
  constexpr int kOps = 200;
  constexpr size_t kBytes = 16 << 10;
  Failures failures;
  failures.add_all(run_peers(2, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options(30000);
    std::vector<taiji_request_t*> reqs(kOps, nullptr);
    std::vector<std::vector<uint8_t>> bufs(kOps);
    if (rank == 0) {
      for (int k = 0; k < kOps; ++k) {
        bufs[k] = payload("ahead", 0, 1, kBytes);
        bufs[k][0] = static_cast<uint8_t>(k);
        failures.expect_status(rank, "send",
                               taiji_send(peer, "ahead", bufs[k].data(), kBytes, TAIJI_U8, 1, &opt, &reqs[k]),
                               TAIJI_OK);
      }
      for (int k = 0; k < kOps; ++k) {
        finish(peer, reqs[k], failures, rank, "send " + std::to_string(k), TAIJI_OK, static_cast<uint64_t>(k + 1));
      }
      return;
    }
    failures.expect(rank, await_read_pause(peer, 0), "reads from rank 0 never paused");
    const uint64_t held = metric_value(peer, "early_arrival_bytes_max");
    failures.expect(rank, held != UINT64_MAX && held <= (128u << 10) + (32u << 10),
                    "held " + std::to_string(held) + " early bytes against a cap of 128 KiB");
    std::vector<GuardedBuffer> got;
    got.reserve(kOps);
    for (int k = 0; k < kOps; ++k) {
      got.emplace_back(kBytes);
      failures.expect_status(rank, "recv",
                             taiji_recv(peer, "ahead", got[k].data(), kBytes, TAIJI_U8, 0, &opt, &reqs[k]), TAIJI_OK);
    }
    std::vector<uint8_t> want = payload("ahead", 0, 1, kBytes);
    for (int k = 0; k < kOps; ++k) {
      const std::string what = "recv " + std::to_string(k);
      finish(peer, reqs[k], failures, rank, what, TAIJI_OK, static_cast<uint64_t>(k + 1));
      want[0] = static_cast<uint8_t>(k);
      check_received(failures, rank, what, got[k], want);
    }
  }));
  check_no_failures(failures);
}

TEST_CASE("p2p: a departed partner fails the ops that need it; other pairs go on", "[p2p]") {
  constexpr int n = 3;
  Failures failures;
  std::atomic<bool> posted{false};
  std::atomic<bool> gone{false};
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options();
    if (rank == 2) {
      failures.expect(rank, await_flag(posted, std::chrono::seconds(20)), "rank 0 never posted");
      failures.expect_status(rank, "finalize", taiji_peer_finalize(peer), TAIJI_OK);
      gone.store(true);
      return;
    }
    if (rank == 0) {
      uint8_t buf[64];
      taiji_request_t* req = nullptr;
      failures.expect_status(rank, "recv from 2", taiji_recv(peer, "gone", buf, 64, TAIJI_U8, 2, &opt, &req),
                             TAIJI_OK);
      posted.store(true);
      taiji_status_t s = req ? wait_bounded(peer, req, 20000, failures, rank, "recv from 2") : TAIJI_OK;
      const std::string error = req ? taiji_request_error(req) : "";
      taiji_request_free(req);
      failures.expect_status(rank, "recv from 2", s, TAIJI_ERR_PEER_LOST);
      failures.expect(rank, contains(error, "rank 2"), "recv from 2: " + error);
    }
    failures.expect(rank, await_flag(gone, std::chrono::seconds(20)), "rank 2 never left");
    // Ranks 0 and 1 still exchange.
    const std::vector<uint8_t> sent = payload("after-gone", 1, 0, 4096);
    GuardedBuffer got(4096);
    taiji_status_t s = rank == 1 ? taiji_send(peer, "after-gone", sent.data(), 4096, TAIJI_U8, 0, &opt, nullptr)
                                 : taiji_recv(peer, "after-gone", got.data(), 4096, TAIJI_U8, 1, &opt, nullptr);
    failures.expect_status(rank, "after-gone", s, TAIJI_OK);
    if (rank == 0) check_received(failures, rank, "after-gone", got, sent);
  }));
  check_no_failures(failures);
}

namespace {

// The process's warnings, while a test runs (taiji_set_log_callback).
struct LogLines {
  std::mutex mu;
  std::vector<std::string> lines;
};

void keep_line(taiji_log_level_t, const char* message, void* user_data) {
  auto* log = static_cast<LogLines*>(user_data);
  std::lock_guard<std::mutex> lock(log->mu);
  log->lines.emplace_back(message);
}

}  // namespace

TEST_CASE("p2p: a stalled send asks only its partner whether it has posted", "[p2p]") {
  constexpr int n = 3;
  EnvOverride stall("TAIJI_STALL_WARN_MS", "200");
  LogLines log;
  REQUIRE(taiji_set_log_callback(keep_line, TAIJI_LOG_WARN, &log) == TAIJI_OK);
  Failures failures;
  std::atomic<bool> reported{false};
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options();
    const std::vector<uint8_t> sent = payload("stalled", 0, 1, 256);
    if (rank == 0) {
      failures.expect_status(rank, "send", taiji_send(peer, "stalled", sent.data(), 256, TAIJI_U8, 1, &opt, nullptr),
                             TAIJI_OK);
    } else if (rank == 1) {
      // Posts only once rank 0's watchdog has reported (bounded).
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (!reported.load() && Clock::now() < deadline) {
        {
          std::lock_guard<std::mutex> lock(log.mu);
          for (const std::string& line : log.lines) {
            if (contains(line, "stall: send 'stalled' version 1 to rank 1")) reported.store(true);
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      GuardedBuffer got(256);
      failures.expect_status(rank, "recv", taiji_recv(peer, "stalled", got.data(), 256, TAIJI_U8, 0, &opt, nullptr),
                             TAIJI_OK);
      check_received(failures, rank, "stalled", got, sent);
    }
  }));
  taiji_set_log_callback(nullptr, TAIJI_LOG_WARN, nullptr);
  failures.expect(0, reported.load(), "no stall report for the send");
  std::lock_guard<std::mutex> lock(log.mu);
  for (const std::string& line : log.lines) {
    if (!contains(line, "stall: send 'stalled'")) continue;
    // Rank 2 takes no part: it is neither asked nor named.
    failures.expect(0, contains(line, "rank(s) 1 have not posted it"), "stall report: " + line);
  }
  check_no_failures(failures);
}
