// Early arrivals are bounded: with a cap far below what one peer sends ahead, the
// receiver stops reading that connection instead of buffering, and everything still
// completes once it posts the ops.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common.h"
#include "harness.h"

using namespace taiji_test;

namespace {

// Sets an environment variable for the peers created inside one test, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// Waits (at most 20 s) until reads from `from` have paused at least once: the early-arrival
// buffer filled up. False if they never did.
bool await_read_pause(taiji_peer_t* peer, int from) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    const uint64_t pauses = metric_value(peer, "read_pauses", from);
    if (pauses != UINT64_MAX && pauses > 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace

TEST_CASE("backpressure: a sender far ahead of its receiver is throttled, not buffered",
          "[backpressure]") {
  // 128 KiB of early-arrival space against 200 ops x 16 KiB (3.2 MiB) or 200 x 1 KiB
  // sent ahead. Both are eager, so they travel before the post; on one host, 16 KiB
  // payloads go through the shared-memory ring, 1 KiB frames whole through the mailbox
  // (and over TCP while it is full), so the receiver pauses with mail waiting.
  ScopedEnv cap("TAIJI_UNEXPECTED_BYTES", "128K");
  constexpr int kOps = 200;
  const size_t kCount = GENERATE(size_t{4096}, size_t{256});
  CAPTURE(kCount);
  Failures failures;
  auto lines = run_peers(2, [&](taiji_peer_t* peer, int rank) {
    std::vector<std::vector<int32_t>> bufs(kOps, std::vector<int32_t>(kCount));
    std::vector<taiji_request_t*> reqs(kOps, nullptr);
    // Rank 0 posts only once the early data has filled its buffer and reads paused, and
    // in reverse order, so the ops whose data fills the buffer are the last it reaches.
    if (rank == 0) {
      failures.expect(rank, await_read_pause(peer, 1), "reads from rank 1 never paused");
      // Held at once: at most the cap, the frame that crossed it (16 KiB and its name), and
      // the mail sent before a TCP frame that arrives while paused: a mailbox's worth of
      // small frames is delivered first even then, since order comes first.
      constexpr uint64_t kMailboxBytes = 64 << 10;  // the runtime's kShmMailboxBytes
      const uint64_t bound = (128u << 10) + (32u << 10) + kMailboxBytes;
      const uint64_t held = metric_value(peer, "early_arrival_bytes_max");
      failures.expect(rank, held != UINT64_MAX && held > 0 && held <= bound,
                      "held " + std::to_string(held) + " early bytes against a cap of 128 KiB (bound " +
                          std::to_string(bound) + ")");
    }
    taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
    opt.timeout_ms = 20000;
    for (int k = 0; k < kOps; ++k) {
      int i = rank == 0 ? kOps - 1 - k : k;
      for (size_t j = 0; j < kCount; ++j) bufs[i][j] = static_cast<int32_t>(i * 7 + j + rank);
      std::string name = "bp/" + std::to_string(i);
      taiji_status_t s = taiji_allreduce(peer, name.c_str(), bufs[i].data(), bufs[i].data(), kCount,
                                         TAIJI_I32, TAIJI_SUM, &opt, &reqs[i]);
      failures.expect_status(rank, "post " + name, s, TAIJI_OK);
    }
    for (int i = 0; i < kOps; ++i) {
      if (reqs[i] == nullptr) continue;
      taiji_status_t s = taiji_request_wait(reqs[i], 30000);
      taiji_request_free(reqs[i]);
      if (!failures.expect_status(rank, "op " + std::to_string(i), s, TAIJI_OK)) continue;
      for (size_t j = 0; j < kCount; ++j) {
        int32_t want = static_cast<int32_t>(2 * (i * 7 + j) + 1);
        if (bufs[i][j] != want) {
          failures.add(rank, "op " + std::to_string(i) + " element " + std::to_string(j) + " is " +
                                 std::to_string(bufs[i][j]) + ", want " + std::to_string(want));
          break;
        }
      }
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("backpressure: an early frame larger than the cap is read whole before reads pause",
          "[backpressure]") {
  // One eager 1 MiB frame against 256 KiB of early-arrival space: the frame alone crosses
  // the cap. Pausing as its header arrives would leave its payload unread for good, and
  // nothing else frees the space; the broadcast (and the link) would hang until timeout.
  ScopedEnv cap("TAIJI_UNEXPECTED_BYTES", "256K");
  ScopedEnv eager("TAIJI_EAGER_BYTES", "1M");
  ScopedEnv chunk("TAIJI_CHUNK_BYTES", "1M");
  const char* shm = GENERATE("off", "auto");
  CAPTURE(shm);
  ScopedEnv transport("TAIJI_SHM", shm);
  constexpr size_t kCount = (1 << 20) / sizeof(int32_t);
  Failures failures;
  auto lines = run_peers(2, [&](taiji_peer_t* peer, int rank) {
    std::vector<int32_t> buf(kCount, rank == 1 ? 7 : 0);
    for (size_t j = 0; j < kCount; j += 4099) buf[j] = rank == 1 ? static_cast<int32_t>(j) : 0;
    taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
    opt.timeout_ms = 10000;
    // Rank 1's whole frame arrives before rank 0 posts: it was read whole, then reads paused.
    if (rank == 0) {
      failures.expect(rank, await_read_pause(peer, 1), "reads from rank 1 never paused");
      const uint64_t held = metric_value(peer, "early_arrival_bytes_max");
      failures.expect(rank, held != UINT64_MAX && held >= (1u << 20),
                      "held " + std::to_string(held) + " early bytes: the 1 MiB frame was not read whole");
    }
    if (!failures.expect_status(rank, "broadcast",
                                taiji_broadcast(peer, "bp.big", buf.data(), kCount, TAIJI_I32, 1, &opt, nullptr),
                                TAIJI_OK)) {
      return;
    }
    for (size_t j = 0; j < kCount; ++j) {
      const int32_t want = j % 4099 == 0 ? static_cast<int32_t>(j) : 7;
      if (buf[j] != want) {
        failures.add(rank, "element " + std::to_string(j) + " is " + std::to_string(buf[j]));
        break;
      }
    }
    // The link carries on.
    int32_t x = rank + 1;
    failures.expect_status(rank, "allreduce after",
                           taiji_allreduce(peer, "bp.after", &x, &x, 1, TAIJI_I32, TAIJI_SUM, &opt, nullptr),
                           TAIJI_OK);
    failures.expect(rank, x == 3, "allreduce after: " + std::to_string(x));
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("backpressure: frames of a version this peer never posts are dropped once the name moves on",
          "[backpressure]") {
  // Rank 1 posts version 2k+1 of "x" (16 KiB, eager) that rank 0 never posts, then
  // version 2k+2 that both post. Rank 0 holds the orphan's frames as early arrivals until
  // version 2k+2 ends there; kept for good, 20 of them would fill its 128 KiB and pause
  // reads from rank 1 for ever, and the later versions would time out.
  ScopedEnv cap("TAIJI_UNEXPECTED_BYTES", "128K");
  constexpr int kRounds = 20;
  constexpr size_t kCount = 4096;
  Failures failures;
  auto lines = run_peers(2, [&](taiji_peer_t* peer, int rank) {
    std::vector<std::vector<int32_t>> orphans(kRounds, std::vector<int32_t>(kCount, 1));
    std::vector<taiji_request_t*> orphan_reqs;
    std::vector<int32_t> buf(kCount);
    for (int k = 0; k < kRounds; ++k) {
      if (rank == 1) {
        taiji_op_options_t orphan_opt = op_options(2000);
        orphan_opt.version = static_cast<uint64_t>(2 * k + 1);
        taiji_request_t* r = nullptr;
        if (failures.expect_status(rank, "post orphan", taiji_allreduce(peer, "x", orphans[k].data(),
                                                                        orphans[k].data(), kCount, TAIJI_I32,
                                                                        TAIJI_SUM, &orphan_opt, &r),
                                   TAIJI_OK)) {
          orphan_reqs.push_back(r);
        }
      }
      taiji_op_options_t opt = op_options(10000);
      opt.version = static_cast<uint64_t>(2 * k + 2);
      std::fill(buf.begin(), buf.end(), rank + 1);
      if (!failures.expect_status(rank, "x v" + std::to_string(2 * k + 2),
                                  taiji_allreduce(peer, "x", buf.data(), buf.data(), kCount, TAIJI_I32, TAIJI_SUM,
                                                  &opt, nullptr),
                                  TAIJI_OK)) {
        break;
      }
      failures.expect(rank, buf[0] == 3 && buf[kCount - 1] == 3, "x: wrong sum");
      // The engine's tick (every 20 ms) drops what can no longer match.
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    for (taiji_request_t* r : orphan_reqs) {
      // Its deadline, or rank 0's finalize first.
      const taiji_status_t s = taiji_request_wait(r, 20000);
      failures.expect(rank, s == TAIJI_ERR_TIMEOUT || s == TAIJI_ERR_PEER_LOST, "orphan: " + status_text(s));
      taiji_request_free(r);
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("backpressure: a root paused on its receiver still sends through a full ring",
          "[backpressure]") {
  // Rank 1's Ready for bp.root and then its eager data reach rank 0 first; the data goes
  // past the cap, so rank 0 stops reading rank 1. Rank 0 then broadcasts 1 MiB as root,
  // waiting for it before posting anything that would free early bytes. On one host its
  // 64 chunks overflow the 64 KiB ring, so most wait for rank 1 to free room, which rank 1
  // announces in the stream rank 0 is not reading. Over TCP the writes never depended on
  // reading; through shared memory they must not either.
  ScopedEnv cap("TAIJI_UNEXPECTED_BYTES", "128K");
  ScopedEnv chunk("TAIJI_CHUNK_BYTES", "16K");
  ScopedEnv ring("TAIJI_SHM_RING_BYTES", "64K");
  const char* shm = GENERATE("off", "auto");
  CAPTURE(shm);
  ScopedEnv transport("TAIJI_SHM", shm);
  constexpr int kOps = 200;
  constexpr size_t kSmall = 4096;
  constexpr size_t kBig = (1 << 20) / sizeof(int32_t);
  Failures failures;
  auto lines = run_peers(2, [&](taiji_peer_t* peer, int rank) {
    std::vector<int32_t> big(kBig, 0);
    if (rank == 0) {
      for (size_t j = 0; j < kBig; ++j) big[j] = static_cast<int32_t>(j * 3 + 1);
    }
    std::vector<std::vector<int32_t>> bufs(kOps, std::vector<int32_t>(kSmall));
    std::vector<taiji_request_t*> reqs(kOps, nullptr);
    taiji_request_t* big_req = nullptr;
    taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
    opt.timeout_ms = 5000;
    if (rank == 0) {
      failures.expect(rank, await_read_pause(peer, 1), "reads from rank 1 never paused");
      failures.expect_status(rank, "broadcast as root",
                             taiji_broadcast(peer, "bp.root", big.data(), kBig, TAIJI_I32, 0, &opt, nullptr),
                             TAIJI_OK);
    } else {
      failures.expect_status(rank, "post broadcast",
                             taiji_broadcast(peer, "bp.root", big.data(), kBig, TAIJI_I32, 0, &opt, &big_req),
                             TAIJI_OK);
    }
    for (int i = 0; i < kOps; ++i) {
      for (size_t j = 0; j < kSmall; ++j) bufs[i][j] = static_cast<int32_t>(i * 7 + j + rank);
      std::string name = "bp.small/" + std::to_string(i);
      failures.expect_status(rank, "post " + name,
                             taiji_allreduce(peer, name.c_str(), bufs[i].data(), bufs[i].data(), kSmall,
                                             TAIJI_I32, TAIJI_SUM, &opt, &reqs[i]),
                             TAIJI_OK);
    }
    if (big_req != nullptr) {
      failures.expect_status(rank, "broadcast", taiji_request_wait(big_req, 10000), TAIJI_OK);
      taiji_request_free(big_req);
    }
    for (size_t j = 0; j < kBig; ++j) {
      if (big[j] != static_cast<int32_t>(j * 3 + 1)) {
        failures.add(rank, "broadcast element " + std::to_string(j) + " is " + std::to_string(big[j]));
        break;
      }
    }
    for (int i = 0; i < kOps; ++i) {
      if (reqs[i] == nullptr) continue;
      taiji_status_t s = taiji_request_wait(reqs[i], 10000);
      taiji_request_free(reqs[i]);
      if (!failures.expect_status(rank, "op " + std::to_string(i), s, TAIJI_OK)) continue;
      const int32_t want = static_cast<int32_t>(2 * (i * 7) + 1);
      if (bufs[i][0] != want) {
        failures.add(rank, "op " + std::to_string(i) + " element 0 is " + std::to_string(bufs[i][0]));
      }
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}
