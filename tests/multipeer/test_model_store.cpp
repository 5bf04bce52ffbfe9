// The model store through the public C API: every rank fetches another's saved model
// (the latest or an explicit version) while the owner's caller is away from taiji; the
// errors (missing name, evicted version, size mismatch, the byte bound, a deadline, an
// abort in flight, bad arguments) come back as documented and lose nothing; models
// larger than one frame arrive whole.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// What `rank` saves as `version` of `name`: bytes no other rank, name or version shares.
std::vector<uint8_t> model_of(const std::string& name, int rank, uint64_t version, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  fill_bytes(salt_of(name + "/" + std::to_string(rank) + "/" + std::to_string(version)), v.data(), bytes);
  return v;
}

void save(Failures& failures, taiji_peer_t* peer, int rank, const std::string& name,
          const std::vector<uint8_t>& bytes, uint64_t want_version) {
  uint64_t saved = 0;
  if (failures.expect_status(rank, "save " + name, taiji_model_save(peer, name.c_str(), bytes.data(), bytes.size(), 0, &saved),
                             TAIJI_OK)) {
    failures.expect(rank, saved == want_version,
                    "save " + name + ": version " + std::to_string(saved) + ", want " + std::to_string(want_version));
  }
}

// Fetches (blocking) and checks the bytes against what the owner saved.
void fetch_and_check(Failures& failures, taiji_peer_t* peer, int rank, int owner, const std::string& name,
                     uint64_t version, const std::vector<uint8_t>& want) {
  const std::string what = "request " + name + " v" + std::to_string(version) + " from " + std::to_string(owner);
  GuardedBuffer got(want.size());
  taiji_op_options_t opt = op_options();
  if (!failures.expect_status(rank, what,
                              taiji_model_request(peer, owner, name.c_str(), version, got.data(), want.size(), &opt, nullptr),
                              TAIJI_OK)) {
    failures.add(rank, what + ": " + taiji_peer_last_error(peer));
    return;
  }
  failures.expect(rank, got.guard_intact(), what + ": wrote past the buffer");
  failures.expect(rank, std::memcmp(got.data(), want.data(), want.size()) == 0, what + ": bytes differ");
}

taiji_status_t request_status(taiji_peer_t* peer, int owner, const std::string& name, uint64_t version, size_t bytes,
                              std::string* error, int64_t timeout_ms = 20000) {
  std::vector<uint8_t> buf(bytes);
  taiji_op_options_t opt = op_options(timeout_ms);
  taiji_status_t s = taiji_model_request(peer, owner, name.c_str(), version, buf.data(), bytes, &opt, nullptr);
  *error = taiji_peer_last_error(peer);
  return s;
}

// A completion callback that holds the peer's I/O thread: its loop serves nothing meanwhile.
void hold_io_thread(taiji_status_t, void* user_data) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(user_data)));
}

}  // namespace

TEST_CASE("model store: every rank fetches the latest and an explicit version while the owner sleeps",
          "[modelstore]") {
  constexpr int n = 4;
  constexpr size_t kBytes = 300000;
  Failures failures;
  std::atomic<int> owner_busy{-1};  // the rank whose caller is away from taiji now
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    for (uint64_t v = 1; v <= 3; ++v) save(failures, peer, rank, "w", model_of("w", rank, v, kBytes), v);
    taiji_op_options_t opt = op_options();
    failures.expect_status(rank, "barrier", taiji_barrier(peer, "saved", &opt, nullptr), TAIJI_OK);
    for (int owner = 0; owner < n; ++owner) {
      if (rank == owner) {
        // Away from taiji: sleeping, then spinning, while every other rank fetches from it.
        owner_busy = owner;
        std::this_thread::sleep_for(std::chrono::milliseconds(700));
        const auto spin_end = Clock::now() + std::chrono::milliseconds(300);
        while (Clock::now() < spin_end) {
        }
        owner_busy = -1;
      } else {
        const auto deadline = Clock::now() + std::chrono::seconds(5);
        while (owner_busy.load() != owner && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        // Several requests in flight at once, from every other rank: latest and explicit.
        std::vector<GuardedBuffer> got;
        for (int k = 0; k < 3; ++k) got.emplace_back(kBytes);
        const uint64_t versions[3] = {0, 2, 1};
        taiji_request_t* reqs[3] = {};
        for (int k = 0; k < 3; ++k) {
          failures.expect_status(rank, "post", taiji_model_request(peer, owner, "w", versions[k], got[k].data(), kBytes, &opt, &reqs[k]),
                                 TAIJI_OK);
        }
        for (int k = 0; k < 3; ++k) {
          if (reqs[k] == nullptr) continue;
          const std::string what = "from " + std::to_string(owner) + " v" + std::to_string(versions[k]);
          failures.expect_status(rank, what, wait_bounded(peer, reqs[k], 20000, failures, rank, what), TAIJI_OK);
          taiji_request_free(reqs[k]);
          const uint64_t want_version = versions[k] == 0 ? 3 : versions[k];
          const std::vector<uint8_t> want = model_of("w", owner, want_version, kBytes);
          failures.expect(rank, got[k].guard_intact() && std::memcmp(got[k].data(), want.data(), kBytes) == 0,
                          what + ": bytes differ");
        }
        failures.expect(rank, owner_busy.load() == owner,
                        "the requests to rank " + std::to_string(owner) + " finished after its caller came back");
      }
      failures.expect_status(rank, "barrier", taiji_barrier(peer, "next", &opt, nullptr), TAIJI_OK);
    }
    // This rank's own store is served too.
    fetch_and_check(failures, peer, rank, rank, "w", 0, model_of("w", rank, 3, kBytes));
  }));
  check_no_failures(failures);
}

TEST_CASE("model store: missing names, evicted versions, sizes and arguments fail as documented", "[modelstore]") {
  EnvOverride keep("TAIJI_MODEL_STORE_VERSIONS", "2");
  Failures failures;
  failures.add_all(run_peers(2, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options();
    if (rank == 0) {
      for (uint64_t v = 1; v <= 3; ++v) save(failures, peer, rank, "m", model_of("m", 0, v, 1000), v);
      uint64_t saved = 0;
      failures.expect_status(rank, "stale save", taiji_model_save(peer, "m", "x", 1, 3, &saved), TAIJI_ERR_STALE_VERSION);
      failures.expect_status(rank, "reserved save", taiji_model_save(peer, "taiji.m", "x", 1, 0, &saved),
                             TAIJI_ERR_INVALID_ARGUMENT);
      failures.expect_status(rank, "NULL name", taiji_model_save(peer, nullptr, "x", 1, 0, &saved), TAIJI_ERR_INVALID_ARGUMENT);
      failures.expect_status(rank, "NULL buffer", taiji_model_save(peer, "m", nullptr, 1, 0, &saved), TAIJI_ERR_INVALID_ARGUMENT);
    }
    failures.expect_status(rank, "barrier", taiji_barrier(peer, "saved", &opt, nullptr), TAIJI_OK);
    if (rank == 1) {
      std::string error;
      failures.expect_status(rank, "missing name", request_status(peer, 0, "nothing", 0, 1000, &error), TAIJI_ERR_NOT_FOUND);
      failures.expect(rank, error == "rank 0: no model 'nothing' was saved", "missing name: " + error);
      failures.expect_status(rank, "evicted", request_status(peer, 0, "m", 1, 1000, &error), TAIJI_ERR_NOT_FOUND);
      failures.expect(rank, error == "rank 0: model 'm' has no version 1 (kept: 2, 3)", "evicted: " + error);
      failures.expect_status(rank, "never saved", request_status(peer, 0, "m", 7, 1000, &error), TAIJI_ERR_NOT_FOUND);
      failures.expect_status(rank, "size", request_status(peer, 0, "m", 0, 999, &error), TAIJI_ERR_MISMATCH);
      failures.expect(rank, error == "rank 0: model 'm' version 3 is 1000 bytes; the request's buffer is 999 bytes",
                      "size: " + error);
      fetch_and_check(failures, peer, rank, 0, "m", 2, model_of("m", 0, 2, 1000));
      fetch_and_check(failures, peer, rank, 0, "m", 0, model_of("m", 0, 3, 1000));
      std::vector<uint8_t> buf(1000);
      failures.expect_status(rank, "rank 2", taiji_model_request(peer, 2, "m", 0, buf.data(), 1000, &opt, nullptr),
                             TAIJI_ERR_INVALID_ARGUMENT);
      failures.expect_status(rank, "rank -1", taiji_model_request(peer, -1, "m", 0, buf.data(), 1000, &opt, nullptr),
                             TAIJI_ERR_INVALID_ARGUMENT);
      failures.expect_status(rank, "NULL name", taiji_model_request(peer, 0, nullptr, 0, buf.data(), 1000, &opt, nullptr),
                             TAIJI_ERR_INVALID_ARGUMENT);
      failures.expect_status(rank, "reserved", taiji_model_request(peer, 0, "taiji.step", 0, buf.data(), 1000, &opt, nullptr),
                             TAIJI_ERR_INVALID_ARGUMENT);
      failures.expect_status(rank, "NULL buffer", taiji_model_request(peer, 0, "m", 0, nullptr, 1000, &opt, nullptr),
                             TAIJI_ERR_INVALID_ARGUMENT);
      failures.expect_status(rank, "own store", request_status(peer, 1, "m", 0, 1000, &error), TAIJI_ERR_NOT_FOUND);
    }
    failures.expect_status(rank, "barrier", taiji_barrier(peer, "done", &opt, nullptr), TAIJI_OK);
  }));
  check_no_failures(failures);
}

TEST_CASE("model store: a save past the byte bound fails and the earlier versions stay", "[modelstore]") {
  EnvOverride bound("TAIJI_MODEL_STORE_BYTES", "1M");
  Failures failures;
  failures.add_all(run_peers(2, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options();
    constexpr size_t kBytes = 400 << 10;
    if (rank == 0) {
      save(failures, peer, rank, "a", model_of("a", 0, 1, kBytes), 1);
      save(failures, peer, rank, "b", model_of("b", 0, 1, kBytes), 1);
      std::vector<uint8_t> c = model_of("c", 0, 1, kBytes);
      failures.expect_status(rank, "past the bound", taiji_model_save(peer, "c", c.data(), kBytes, 0, nullptr),
                             TAIJI_ERR_NO_MEMORY);
      const std::string error = taiji_peer_last_error(peer);
      failures.expect(rank, error == "model 'c': saving 409600 bytes would pass the store's bound "
                                     "(TAIJI_MODEL_STORE_BYTES) of 1048576 bytes; it holds 819200 bytes",
                      "bound: " + error);
    }
    failures.expect_status(rank, "barrier", taiji_barrier(peer, "saved", &opt, nullptr), TAIJI_OK);
    if (rank == 1) {
      fetch_and_check(failures, peer, rank, 0, "a", 1, model_of("a", 0, 1, kBytes));
      fetch_and_check(failures, peer, rank, 0, "b", 0, model_of("b", 0, 1, kBytes));
      std::string error;
      failures.expect_status(rank, "not saved", request_status(peer, 0, "c", 0, kBytes, &error), TAIJI_ERR_NOT_FOUND);
    }
    failures.expect_status(rank, "barrier", taiji_barrier(peer, "done", &opt, nullptr), TAIJI_OK);
  }));
  check_no_failures(failures);
}

TEST_CASE("model store: a request meets its deadline, and an abort fails one in flight", "[modelstore]") {
  Failures failures;
  PeerOptions options;
  // Rank 1 aborts at the end: rank 0 sees it lost.
  options.finalize_ok = [](int rank, taiji_status_t s) {
    return rank == 1 ? s == TAIJI_OK || s == TAIJI_ERR_ABORTED : s == TAIJI_OK || s == TAIJI_ERR_PEER_LOST;
  };
  std::atomic<int> phase{0};  // rank 0: 1 holding its I/O thread, 2 free, 3 holding again
  failures.add_all(run_peers(2, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options();
    if (rank == 0) save(failures, peer, rank, "m", model_of("m", 0, 1, 4096), 1);
    failures.expect_status(rank, "barrier", taiji_barrier(peer, "saved", &opt, nullptr), TAIJI_OK);
    if (rank == 0) {
      // Holds rank 0's I/O thread for 1.5 s (a callback that sleeps), so nothing answers.
      static int hold_ms = 1500;
      std::vector<uint8_t> mine(4096);
      taiji_op_options_t hold = op_options();
      hold.callback = hold_io_thread;
      hold.user_data = &hold_ms;
      for (int round = 0; round < 2; ++round) {
        taiji_request_t* req = nullptr;
        failures.expect_status(rank, "hold", taiji_model_request(peer, 0, "m", 0, mine.data(), 4096, &hold, &req), TAIJI_OK);
        phase = round == 0 ? 1 : 3;
        if (req != nullptr) {
          failures.expect_status(rank, "hold", wait_bounded(peer, req, 10000, failures, rank, "hold"), TAIJI_OK);
          taiji_request_free(req);
        }
        // The callback may still be sleeping after the waiter saw the request complete.
        std::this_thread::sleep_for(std::chrono::milliseconds(1600));
        phase = 2;
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
      return;
    }
    auto await_phase = [&](int want) {
      const auto end = Clock::now() + std::chrono::seconds(10);
      while (phase.load() != want && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      failures.expect(rank, phase.load() == want, "rank 0 never reached phase " + std::to_string(want));
    };
    await_phase(1);
    std::string error;
    const auto start = Clock::now();
    failures.expect_status(rank, "deadline", request_status(peer, 0, "m", 0, 4096, &error, 300), TAIJI_ERR_TIMEOUT);
    const double took = ms_since(start);
    failures.expect(rank, took >= 299 && took < 1000, "deadline after " + std::to_string(took) + " ms");
    failures.expect(rank, contains(error, "model request for 'm' (latest) from rank 0 timed out after"), "deadline: " + error);
    // Once rank 0 answers again (its late reply to the request above is dropped), it serves.
    await_phase(2);
    fetch_and_check(failures, peer, rank, 0, "m", 1, model_of("m", 0, 1, 4096));
    // In flight when this peer aborts (rank 0 holds its I/O thread again): ABORTED.
    await_phase(3);
    std::vector<uint8_t> buf(4096);
    taiji_request_t* req = nullptr;
    opt.timeout_ms = 30000;
    failures.expect_status(rank, "post", taiji_model_request(peer, 0, "m", 0, buf.data(), 4096, &opt, &req), TAIJI_OK);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    taiji_peer_abort(peer);
    if (req != nullptr) {
      failures.expect_status(rank, "in flight at abort", taiji_request_wait(req, 5000), TAIJI_ERR_ABORTED);
      taiji_request_free(req);
    }
  }, options));
  check_no_failures(failures);
}

TEST_CASE("model store: models larger than one frame arrive whole", "[modelstore]") {
  Failures failures;
  SECTION("80 MiB, above the default max payload (64 MiB)") {
    failures.add_all(run_peers(2, [&](taiji_peer_t* peer, int rank) {
      constexpr size_t kBytes = 80u << 20;
      taiji_op_options_t opt = op_options();
      if (rank == 0) save(failures, peer, rank, "big", model_of("big", 0, 1, kBytes), 1);
      failures.expect_status(rank, "barrier", taiji_barrier(peer, "saved", &opt, nullptr), TAIJI_OK);
      if (rank == 1) fetch_and_check(failures, peer, rank, 0, "big", 0, model_of("big", 0, 1, kBytes));
      failures.expect_status(rank, "barrier", taiji_barrier(peer, "done", &opt, nullptr), TAIJI_OK);
    }));
  }
  SECTION("5 MiB + 3 bytes in frames of at most 1 MiB, to three ranks at once") {
    EnvOverride payload("TAIJI_MAX_PAYLOAD_BYTES", "1M");
    failures.add_all(run_peers(4, [&](taiji_peer_t* peer, int rank) {
      constexpr size_t kBytes = (5u << 20) + 3;
      taiji_op_options_t opt = op_options();
      if (rank == 0) save(failures, peer, rank, "odd", model_of("odd", 0, 1, kBytes), 1);
      failures.expect_status(rank, "barrier", taiji_barrier(peer, "saved", &opt, nullptr), TAIJI_OK);
      if (rank != 0) fetch_and_check(failures, peer, rank, 0, "odd", 1, model_of("odd", 0, 1, kBytes));
      failures.expect_status(rank, "barrier", taiji_barrier(peer, "done", &opt, nullptr), TAIJI_OK);
    }));
  }
  check_no_failures(failures);
}
