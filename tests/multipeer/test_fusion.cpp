// Fusion of small allreduces (TAIJI_FUSION=on): ops posted in different orders on every
// rank are fused identically and give the serial results; ineligible ops mixed in run
// unfused; disagreements still end in Mismatch on every rank; abort and deadlines fail
// waiting ops instead of leaving them behind.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <deque>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

// Every op's output digest on every rank: [rank][op].
using Digests = std::vector<std::vector<uint64_t>>;

std::vector<ReduceCase> mixed_cases(int count) {
  std::vector<ReduceCase> cases;
  for (int k = 0; k < count; ++k) {
    ReduceCase c;
    c.dtype = kAllDtypes[k % 10];
    c.op = kAllOps[(k / 3) % 5];
    // Every ninth op is over the 64 KiB fusion limit for any dtype: it runs unfused; every
    // seventh is a few elements, reduced from the negotiation's own data.
    c.count = k % 9 == 4 ? 70000 : k % 7 == 2 ? static_cast<size_t>(1 + k % 2) : static_cast<size_t>(1 + (k * 37) % 1500);
    c.salt = salt_of("fusion/" + std::to_string(k));
    cases.push_back(c);
  }
  return cases;
}

std::string op_name_of(int k) { return "fusion/" + std::to_string(k); }

size_t count_fused(taiji_peer_t* peer) {
  size_t needed = 0;
  taiji_flight_recorder_json(peer, nullptr, 0, &needed);
  std::string json(needed + 1, '\0');
  if (taiji_flight_recorder_json(peer, json.data(), json.size(), &needed) != TAIJI_OK) return 0;
  size_t found = 0;
  const std::string mark = "\"strategy\":\"fused\"";
  for (size_t at = json.find(mark); at != std::string::npos; at = json.find(mark, at + 1)) ++found;
  return found;
}

// Posts the cases in a rank-specific order, waits in another, checks each result against
// the serial reference; returns the output digests. fused_min: fewest ops this rank's
// flight recorder must show as fused.
Digests run_mixed(int n, const std::vector<ReduceCase>& cases, size_t fused_min, size_t fused_max,
                  Failures& failures) {
  Digests digests(n, std::vector<uint64_t>(cases.size(), 0));
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    std::vector<std::unique_ptr<GuardedBuffer>> in;
    std::vector<std::unique_ptr<GuardedBuffer>> out;
    for (const ReduceCase& c : cases) {
      in.push_back(std::make_unique<GuardedBuffer>(c.count * dtype_size(c.dtype)));
      out.push_back(std::make_unique<GuardedBuffer>(c.count * dtype_size(c.dtype)));
      fill_input(c, rank, in.back()->data());
    }
    std::vector<size_t> post_order(cases.size());
    std::iota(post_order.begin(), post_order.end(), size_t{0});
    std::vector<size_t> wait_order = post_order;
    std::mt19937 rng(77 + rank);
    std::shuffle(post_order.begin(), post_order.end(), rng);
    std::shuffle(wait_order.begin(), wait_order.end(), rng);
    std::vector<taiji_request_t*> reqs(cases.size(), nullptr);
    taiji_op_options_t opt = op_options(30000);
    for (size_t k : post_order) {
      const ReduceCase& c = cases[k];
      failures.expect_status(rank, "post " + op_name_of(static_cast<int>(k)),
                             taiji_allreduce(peer, op_name_of(static_cast<int>(k)).c_str(), in[k]->data(),
                                             out[k]->data(), c.count, c.dtype, c.op, &opt, &reqs[k]),
                             TAIJI_OK);
    }
    for (size_t k : wait_order) {
      if (reqs[k] == nullptr) continue;
      const std::string name = op_name_of(static_cast<int>(k));
      taiji_status_t s = wait_bounded(peer, reqs[k], 40000, failures, rank, name);
      taiji_request_free(reqs[k]);
      if (!failures.expect_status(rank, name, s, TAIJI_OK)) continue;
      failures.expect(rank, out[k]->guard_intact(), name + ": wrote past the buffer");
      std::string err = check_reduce(cases[k], n, out[k]->data());
      if (!err.empty()) failures.add(rank, name + " (" + describe(cases[k]) + "): " + err);
      digests[rank][k] = digest(out[k]->data(), out[k]->size());
    }
    size_t fused = count_fused(peer);
    failures.expect(rank, fused >= fused_min && fused <= fused_max,
                    std::to_string(fused) + " ops recorded as fused, expected " +
                        std::to_string(fused_min) + ".." + std::to_string(fused_max));
  });
  failures.add_all(lines);
  return digests;
}

// Runs `body` on n peers with fusion on and fails the case on any failure it recorded.
// Its ops end in errors on purpose, so a peer's finalize may report one too.
void run_fused_failing_ops(int n, Failures& failures, const std::function<void(taiji_peer_t*, int)>& body) {
  EnvOverride fusion("TAIJI_FUSION", "on");
  PeerOptions po;
  po.finalize_ok = [](int, taiji_status_t) { return true; };
  failures.add_all(run_peers(n, body, po));
  check_no_failures(failures);
}

}  // namespace

TEST_CASE("fusion: 100 mixed ops in a different order per rank, same results as unfused", "[fusion]") {
  constexpr int n = 4;
  const auto cases = mixed_cases(100);
  const size_t unfused = static_cast<size_t>(
      std::count_if(cases.begin(), cases.end(), [](const ReduceCase& c) { return c.count == 70000; }));
  Failures failures;
  Digests on;
  Digests off;
  // Rounds and groups are recorded too: room for all of them, whatever the skew.
  EnvOverride recorder("TAIJI_FLIGHT_RECORDER_SIZE", "100000");
  {
    EnvOverride fusion("TAIJI_FUSION", "on");
    on = run_mixed(n, cases, cases.size() - unfused, cases.size() - unfused, failures);
  }
  {
    EnvOverride fusion("TAIJI_FUSION", "off");
    off = run_mixed(n, cases, 0, 0, failures);
  }
  check_no_failures(failures);
  for (int r = 0; r < n; ++r) {
    for (size_t k = 0; k < cases.size(); ++k) {
      CAPTURE(r, k);
      REQUIRE(on[r][k] == off[r][k]);
      REQUIRE(on[r][k] == on[0][k]);
    }
  }
}

TEST_CASE("fusion: a count or dtype disagreement is a mismatch on every rank", "[fusion]") {
  constexpr int n = 3;
  EnvOverride fusion("TAIJI_FUSION", "on");
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    std::vector<float> good_in(8, 1.0f), good_out(8, 0.0f);
    std::vector<float> bad_in(16, 1.0f), bad_out(16, 0.0f);
    std::vector<float> big_in(20000, 1.0f), big_out(20000, 0.0f);
    taiji_op_options_t opt = op_options(20000);
    taiji_request_t* good = nullptr;
    taiji_request_t* count = nullptr;
    taiji_request_t* dtype = nullptr;
    taiji_request_t* size = nullptr;
    // Rank 1 disagrees on a count, rank 2 on a dtype; rank 0 posts one op too big to fuse
    // where the others' copy is small enough, so it runs unfused on rank 0 only.
    size_t bad_count = rank == 1 ? 16 : 12;
    taiji_dtype_t bad_dtype = rank == 2 ? TAIJI_I32 : TAIJI_F32;
    size_t big_count = rank == 0 ? 20000 : 4;
    failures.expect_status(rank, "post count", taiji_allreduce(peer, "mm/count", bad_in.data(), bad_out.data(),
                                                              bad_count, TAIJI_F32, TAIJI_SUM, &opt, &count),
                           TAIJI_OK);
    failures.expect_status(rank, "post good", taiji_allreduce(peer, "mm/good", good_in.data(), good_out.data(),
                                                             8, TAIJI_F32, TAIJI_SUM, &opt, &good),
                           TAIJI_OK);
    failures.expect_status(rank, "post dtype", taiji_allreduce(peer, "mm/dtype", bad_in.data(), bad_out.data(),
                                                              4, bad_dtype, TAIJI_SUM, &opt, &dtype),
                           TAIJI_OK);
    failures.expect_status(rank, "post size", taiji_allreduce(peer, "mm/size", big_in.data(), big_out.data(),
                                                             big_count, TAIJI_F32, TAIJI_SUM, &opt, &size),
                           TAIJI_OK);
    failures.expect_status(rank, "good", wait_bounded(peer, good, 30000, failures, rank, "good"), TAIJI_OK);
    failures.expect(rank, good_out[0] == 3.0f && good_out[7] == 3.0f, "good: wrong sum");
    failures.expect_status(rank, "count", wait_bounded(peer, count, 30000, failures, rank, "count"),
                           TAIJI_ERR_MISMATCH);
    failures.expect_status(rank, "dtype", wait_bounded(peer, dtype, 30000, failures, rank, "dtype"),
                           TAIJI_ERR_MISMATCH);
    failures.expect_status(rank, "size", wait_bounded(peer, size, 30000, failures, rank, "size"),
                           TAIJI_ERR_MISMATCH);
    for (taiji_request_t* r : {good, count, dtype, size}) taiji_request_free(r);
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("fusion: abort fails ops still waiting to be fused, on every rank", "[fusion]") {
  Failures failures;
  run_fused_failing_ops(3, failures, [&](taiji_peer_t* peer, int rank) {
    std::vector<int32_t> in(64, rank + 1), out(64, 0);
    taiji_op_options_t opt = op_options(60000);
    // Settles first: all ranks post it.
    failures.expect_status(rank, "shared", taiji_allreduce(peer, "ab/shared", in.data(), out.data(), 64,
                                                          TAIJI_I32, TAIJI_SUM, &opt, nullptr),
                           TAIJI_OK);
    failures.expect(rank, out[0] == 6 && out[63] == 6, "shared: wrong sum");
    // Only this rank posts it: it waits in fusion until the abort.
    std::string lonely = "ab/only-" + std::to_string(rank);
    taiji_request_t* req = nullptr;
    failures.expect_status(rank, "post lonely", taiji_allreduce(peer, lonely.c_str(), in.data(), out.data(), 64,
                                                               TAIJI_I32, TAIJI_SUM, &opt, &req),
                           TAIJI_OK);
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      taiji_peer_abort(peer);
    }
    // Rank 1 aborted; the others lose it. Either way nothing waits out the 60 s deadline.
    auto start = Clock::now();
    taiji_status_t s = wait_bounded(peer, req, 20000, failures, rank, lonely);
    failures.expect(rank, s != TAIJI_OK, lonely + " completed without its peers");
    if (rank == 1) failures.expect_status(rank, lonely, s, TAIJI_ERR_ABORTED);
    failures.expect(rank, ms_since(start) < 15000, lonely + " outlived the abort by " +
                                                       std::to_string(ms_since(start)) + " ms");
    taiji_request_free(req);
  });
}

TEST_CASE("fusion: an op no other rank posts times out by its own deadline", "[fusion]") {
  Failures failures;
  std::atomic<bool> done{false};
  run_fused_failing_ops(2, failures, [&](taiji_peer_t* peer, int rank) {
    std::vector<double> in(4, 1.0), out(4, 0.0);
    if (rank != 0) {
      // Stays in the job (a departed rank would make it PeerLost) without posting it.
      auto start = Clock::now();
      while (!done && ms_since(start) < 10000) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    taiji_op_options_t opt = op_options(300);
    auto start = Clock::now();
    taiji_status_t s = taiji_allreduce(peer, "to/lonely", in.data(), out.data(), 4, TAIJI_F64, TAIJI_SUM,
                                       &opt, nullptr);
    const double took = ms_since(start);
    failures.expect_status(rank, "lonely", s, TAIJI_ERR_TIMEOUT);
    // Not at once, and not by any deadline but its own.
    failures.expect(rank, took >= 0.8 * 300 && took < 5000, "timed out after " + std::to_string(took) + " ms");
    done = true;
  });
}

TEST_CASE("fusion: an orphan op times out by its deadline while other ops keep being fused", "[fusion]") {
  // Batches posted back to back keep a round running on rank 0 at all times; the orphan
  // must not ride along from round to round past its deadline.
  constexpr int n = 2;
  constexpr int kBatch = 10;
  constexpr int kDepth = 4;  // batches in flight: both ranks nearly always have ops waiting
  constexpr double kFlowMs = 2000;
  // Batches each rank posts: decided by rank 0 once the flow has run kFlowMs. Rank 1 is at
  // most kDepth - 1 batches ahead (it waits for batch b - kDepth + 1 before it posts b + 1).
  std::atomic<int> batches{INT_MAX};
  Failures failures;
  run_fused_failing_ops(n, failures, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options(20000);
    std::vector<float> orphan(16, 1.0f);
    taiji_request_t* orphan_req = nullptr;
    if (rank == 0) {
      taiji_op_options_t short_opt = op_options(300);
      failures.expect_status(rank, "post orphan", taiji_allreduce(peer, "orphan", orphan.data(), orphan.data(),
                                                                  orphan.size(), TAIJI_F32, TAIJI_SUM, &short_opt,
                                                                  &orphan_req), TAIJI_OK);
    }
    const auto start = Clock::now();
    double orphan_done_ms = -1;
    std::vector<std::vector<float>> bufs(kDepth * kBatch, std::vector<float>(1024, 1.0f));
    std::deque<std::vector<taiji_request_t*>> in_flight;
    for (int b = 0; b < batches.load(); ++b) {
      if (rank == 0 && batches.load() == INT_MAX && ms_since(start) >= kFlowMs) batches = b + kDepth;
      // Batch b goes out before batch b - kDepth + 1 is waited for.
      std::vector<taiji_request_t*> posted;
      for (int i = 0; i < kBatch; ++i) {
        std::vector<float>& buf = bufs[(b % kDepth) * kBatch + i];
        std::fill(buf.begin(), buf.end(), 1.0f);
        taiji_request_t* r = nullptr;
        const std::string name = "flow/" + std::to_string(i);
        if (!failures.expect_status(rank, name, taiji_allreduce(peer, name.c_str(), buf.data(), buf.data(),
                                                                buf.size(), TAIJI_F32, TAIJI_SUM, &opt, &r),
                                    TAIJI_OK)) {
          batches = 0;
          break;
        }
        posted.push_back(r);
      }
      in_flight.push_back(std::move(posted));
      if (in_flight.size() == kDepth) {
        for (taiji_request_t* r : in_flight.front()) {
          failures.expect_status(rank, "flow", taiji_request_wait(r, 20000), TAIJI_OK);
          taiji_request_free(r);
        }
        in_flight.pop_front();
      }
      if (orphan_req != nullptr && orphan_done_ms < 0 && taiji_request_test(orphan_req) != TAIJI_IN_PROGRESS) {
        orphan_done_ms = ms_since(start);
      }
    }
    for (auto& batch : in_flight) {
      for (taiji_request_t* r : batch) {
        failures.expect_status(rank, "flow", taiji_request_wait(r, 20000), TAIJI_OK);
        taiji_request_free(r);
      }
    }
    if (orphan_req != nullptr) {
      failures.expect_status(rank, "orphan", taiji_request_wait(orphan_req, 20000), TAIJI_ERR_TIMEOUT);
      // Soon after its deadline, while the flow still ran.
      failures.expect(rank, orphan_done_ms >= 0 && orphan_done_ms < kFlowMs / 2,
                      "the orphan ended " + std::to_string(orphan_done_ms) + " ms into a " +
                          std::to_string(kFlowMs) + " ms flow (its deadline: 300 ms)");
      taiji_request_free(orphan_req);
    }
    failures.expect_status(rank, "sync", taiji_barrier(peer, "flow/end", &opt, nullptr), TAIJI_OK);
  });
}

TEST_CASE("fusion: an op past its deadline does not fail the ops fused with it", "[fusion]") {
  // Rank 1 posts its batch 200 ms after rank 0, so rank 0's op with a 50 ms deadline is
  // past it when the round settles; the group it is fused into (12 MiB over TCP, slower
  // than the engine's 20 ms tick) must keep the others' 20 s.
  constexpr int n = 2;
  constexpr int kOps = 200;
  constexpr size_t kCount = 16384;  // 64 KiB of f32, the largest op fusion takes
  EnvOverride shm("TAIJI_SHM", "off");
  EnvOverride buffer("TAIJI_FUSION_BUFFER_BYTES", "64M");
  Failures failures;
  run_fused_failing_ops(n, failures, [&](taiji_peer_t* peer, int rank) {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    taiji_op_options_t opt = op_options(20000);
    taiji_op_options_t short_opt = op_options(50);
    std::vector<std::vector<float>> bufs(kOps + 1, std::vector<float>(kCount, static_cast<float>(rank + 1)));
    std::vector<taiji_request_t*> reqs(kOps + 1, nullptr);
    failures.expect_status(rank, "group start", taiji_group_start(peer), TAIJI_OK);
    for (int i = 0; i <= kOps; ++i) {
      const std::string name = i == kOps ? "late/short" : "late/" + std::to_string(i);
      failures.expect_status(rank, "post " + name,
                             taiji_allreduce(peer, name.c_str(), bufs[i].data(), bufs[i].data(), kCount, TAIJI_F32,
                                             TAIJI_SUM, i == kOps ? &short_opt : &opt, &reqs[i]),
                             TAIJI_OK);
    }
    failures.expect_status(rank, "group end", taiji_group_end(peer), TAIJI_OK);
    int failed = 0;
    for (int i = 0; i <= kOps; ++i) {
      if (reqs[i] == nullptr) continue;
      const taiji_status_t s = taiji_request_wait(reqs[i], 30000);
      if (i < kOps && s != TAIJI_OK) ++failed;
      if (i < kOps && s == TAIJI_OK && (bufs[i][0] != 3.0f || bufs[i][kCount - 1] != 3.0f)) ++failed;
      if (i < kOps && s != TAIJI_OK && failed == 1) {
        failures.add(rank, "late/" + std::to_string(i) + ": " + status_text(s) + ": " +
                               taiji_request_error(reqs[i]));
      }
      taiji_request_free(reqs[i]);
    }
    failures.expect(rank, failed == 0, std::to_string(failed) + " of the long-deadline ops failed or were wrong");
  });
}

TEST_CASE("fusion: batch after batch through reused buffers, every result is its own batch's", "[fusion]") {
  constexpr int n = 2;
  constexpr int batches = 6;
  EnvOverride fusion("TAIJI_FUSION", "on");
  Failures failures;
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    for (int b = 0; b < batches; ++b) {
      // Sizes and dtypes change from batch to batch, so that a reused buffer is sometimes
      // longer than the group and holds another batch's bytes past its end.
      std::vector<ReduceCase> cases(24);
      std::vector<std::vector<uint8_t>> in(cases.size()), out(cases.size());
      std::vector<taiji_request_t*> reqs(cases.size(), nullptr);
      taiji_op_options_t opt = op_options(30000);
      for (size_t k = 0; k < cases.size(); ++k) {
        ReduceCase& c = cases[k];
        c.dtype = b % 2 == 0 ? TAIJI_F32 : TAIJI_I64;
        c.count = 64 + static_cast<size_t>((k * 131 + static_cast<size_t>(b) * 977) % 900);
        c.salt = salt_of("reuse/" + std::to_string(b) + "/" + std::to_string(k));
        in[k].resize(c.count * dtype_size(c.dtype));
        out[k].assign(c.count * dtype_size(c.dtype), 0xee);
        fill_input(c, rank, in[k].data());
        const std::string name = "reuse/" + std::to_string(k);
        failures.expect_status(rank, "post " + name,
                               taiji_allreduce(peer, name.c_str(), in[k].data(), out[k].data(), c.count, c.dtype,
                                               c.op, &opt, &reqs[k]),
                               TAIJI_OK);
      }
      wait_and_check(peer, rank, n, cases, reqs, out, "reuse/", " batch " + std::to_string(b), failures);
    }
  }));
  check_no_failures(failures);
}

TEST_CASE("fusion: an op only one rank posts holds back the ops every rank posted only briefly", "[fusion]") {
  constexpr int n = 3;
  Failures failures;
  std::atomic<bool> lonely_ended{false};
  run_fused_failing_ops(n, failures, [&](taiji_peer_t* peer, int rank) {
    std::vector<int32_t> in(256, rank + 1), out(256, 0), lonely_out(256, 0);
    // Far longer than shared takes even on a loaded machine: shared must end while this runs.
    taiji_op_options_t lonely_opt = op_options(6000);
    taiji_request_t* lonely = nullptr;
    // Rank 0's list is longer than the others' in every round: rounds may leave the shared
    // op for a later round while ranks are still posting, but only a bounded number of times.
    if (rank == 0) {
      failures.expect_status(rank, "post lonely",
                             taiji_allreduce(peer, "hb/only0", in.data(), lonely_out.data(), 256, TAIJI_I32,
                                             TAIJI_SUM, &lonely_opt, &lonely),
                             TAIJI_OK);
    }
    taiji_op_options_t opt = op_options(20000);
    failures.expect_status(rank, "shared", taiji_allreduce(peer, "hb/shared", in.data(), out.data(), 256,
                                                          TAIJI_I32, TAIJI_SUM, &opt, nullptr),
                           TAIJI_OK);
    failures.expect(rank, out[0] == 6 && out[255] == 6, "shared: wrong sum");
    if (lonely != nullptr) {
      // Held back until the lonely op ended, shared would finish only after its deadline.
      failures.expect_status(rank, "lonely right after shared", taiji_request_test(lonely), TAIJI_IN_PROGRESS);
      failures.expect_status(rank, "lonely", wait_bounded(peer, lonely, 20000, failures, rank, "lonely"),
                             TAIJI_ERR_TIMEOUT);
      taiji_request_free(lonely);
      lonely_ended = true;
    }
    // The others stay (a departed rank would end it with PeerLost instead).
    auto stay = Clock::now();
    while (!lonely_ended && ms_since(stay) < 20000) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
}
