// Groups (taiji_group_start / taiji_group_end): a thread's posts are held until the
// outermost end, then handed over together; with fusion on, a batch posted in one group
// on every rank is settled by one negotiation round, whatever the posting order; misuse
// fails at once and loses nothing; closing the peer fails held ops.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

std::string last_error(taiji_peer_t* peer) { return taiji_peer_last_error(peer); }

}  // namespace

TEST_CASE("group: a batch posted in one group is fused whole, in one round per batch", "[group]") {
  constexpr int n = 4;
  constexpr int batches = 3;
  constexpr size_t ops = 40;
  EnvOverride fusion("TAIJI_FUSION", "on");
  EnvOverride recorder("TAIJI_FLIGHT_RECORDER_SIZE", "100000");
  Failures failures;
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    std::mt19937 rng(static_cast<unsigned>(31 + rank));
    for (int b = 0; b < batches; ++b) {
      std::vector<ReduceCase> cases(ops);
      std::vector<std::vector<uint8_t>> in(ops), out(ops);
      for (size_t k = 0; k < ops; ++k) {
        ReduceCase& c = cases[k];
        c.dtype = k % 3 == 0 ? TAIJI_I32 : TAIJI_F32;
        c.op = k % 4 == 1 ? TAIJI_MAX : TAIJI_SUM;
        c.count = 16 + (k * 97 + static_cast<size_t>(b) * 31) % 1000;
        c.salt = salt_of("group/" + std::to_string(b) + "/" + std::to_string(k));
        in[k].resize(c.count * dtype_size(c.dtype));
        out[k].assign(in[k].size(), 0xee);
        fill_input(c, rank, in[k].data());
      }
      // Every rank posts the batch in its own order.
      std::vector<size_t> order(ops);
      std::iota(order.begin(), order.end(), size_t{0});
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<taiji_request_t*> reqs(ops, nullptr);
      taiji_op_options_t opt = op_options(30000);
      failures.expect_status(rank, "group_start", taiji_group_start(peer), TAIJI_OK);
      for (size_t k : order) {
        const ReduceCase& c = cases[k];
        const std::string name = "group/" + std::to_string(k);
        failures.expect_status(rank, "post " + name,
                               taiji_allreduce(peer, name.c_str(), in[k].data(), out[k].data(), c.count, c.dtype,
                                               c.op, &opt, &reqs[k]),
                               TAIJI_OK);
      }
      failures.expect_status(rank, "group_end", taiji_group_end(peer), TAIJI_OK);
      wait_and_check(peer, rank, n, cases, reqs, out, "group/", " batch " + std::to_string(b), failures);
    }
    // Each rank listed a whole batch in the first round it took part in: the lists agreed,
    // so every batch took exactly one round and ran as one fused allreduce per (dtype,
    // reduction): i32 and f32, sum and max, four per batch.
    const size_t rounds = count_named(peer, "taiji.fuse.round");
    failures.expect(rank, rounds == batches,
                    "negotiation rounds: " + std::to_string(rounds) + ", want " + std::to_string(batches));
    const size_t groups = count_named(peer, "taiji.fuse");
    failures.expect(rank, groups == 4 * batches,
                    "fused allreduces: " + std::to_string(groups) + ", want " + std::to_string(4 * batches));
  }));
  check_no_failures(failures);
}

TEST_CASE("group: held ops wait for the outermost end; misuse fails at once and loses nothing", "[group]") {
  Failures failures;
  failures.add_all(run_peers(1, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options(10000);
    failures.expect_status(rank, "end without a group", taiji_group_end(peer), TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect(rank, last_error(peer).find("no group is open") != std::string::npos,
                    "end without a group: error text: " + last_error(peer));

    std::vector<int32_t> a_in(100), a_out(100, -1), b_in(50), b_out(50, -1);
    std::iota(a_in.begin(), a_in.end(), 1);
    std::iota(b_in.begin(), b_in.end(), 1000);
    taiji_request_t* a = nullptr;
    taiji_request_t* b = nullptr;
    failures.expect_status(rank, "start", taiji_group_start(peer), TAIJI_OK);
    failures.expect_status(rank, "post a",
                           taiji_allreduce(peer, "held/a", a_in.data(), a_out.data(), a_in.size(), TAIJI_I32,
                                           TAIJI_SUM, &opt, &a),
                           TAIJI_OK);
    // A blocking call would wait for an end that cannot come: refused, nothing posted.
    failures.expect_status(rank, "blocking barrier in a group", taiji_barrier(peer, "held/barrier", &opt, nullptr),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect(rank, last_error(peer).find("inside an open group") != std::string::npos,
                    "blocking call: error text: " + last_error(peer));
    // Bad arguments fail at once, as outside a group.
    failures.expect_status(rank, "bad dtype in a group",
                           taiji_allreduce(peer, "held/bad", a_in.data(), a_out.data(), a_in.size(),
                                           static_cast<taiji_dtype_t>(99), TAIJI_SUM, &opt, &b),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect_status(rank, "nested start", taiji_group_start(peer), TAIJI_OK);
    failures.expect_status(rank, "post b",
                           taiji_allreduce(peer, "held/b", b_in.data(), b_out.data(), b_in.size(), TAIJI_I32,
                                           TAIJI_SUM, &opt, &b),
                           TAIJI_OK);
    failures.expect_status(rank, "inner end", taiji_group_end(peer), TAIJI_OK);
    // Another thread's posts are not held by this thread's group.
    std::thread other([&] {
      failures.expect_status(rank, "other thread's barrier", taiji_barrier(peer, "held/other", &opt, nullptr),
                             TAIJI_OK);
    });
    other.join();
    // The loop starts ops in the order they reach it, so had a and b not been held they
    // would have started before the barrier, which did (an op enters the flight recorder
    // as it starts); and on a single peer an op completes as soon as it starts.
    failures.expect(rank, count_named(peer, "held/other") == 1, "the other thread's barrier is not recorded");
    failures.expect(rank, count_named(peer, "held/a") == 0 && count_named(peer, "held/b") == 0,
                    "an op of the open group started");
    failures.expect_status(rank, "test a in the group", taiji_request_test(a), TAIJI_IN_PROGRESS);
    failures.expect_status(rank, "test b after the inner end", taiji_request_test(b), TAIJI_IN_PROGRESS);
    const auto before = Clock::now();
    failures.expect_status(rank, "wait on a held op", taiji_request_wait(a, 5000), TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect(rank, ms_since(before) < 2500, "the refused wait blocked");
    failures.expect(rank, last_error(peer).find("taiji_group_end first") != std::string::npos,
                    "held wait: error text: " + last_error(peer));
    failures.expect_status(rank, "outer end", taiji_group_end(peer), TAIJI_OK);
    failures.expect_status(rank, "wait a", wait_bounded(peer, a, 10000, failures, rank, "a"), TAIJI_OK);
    failures.expect_status(rank, "wait b", wait_bounded(peer, b, 10000, failures, rank, "b"), TAIJI_OK);
    failures.expect(rank, a_out == a_in && b_out == b_in, "a single peer's allreduce copies its input");
    failures.expect_status(rank, "end after the outermost", taiji_group_end(peer), TAIJI_ERR_INVALID_ARGUMENT);
    taiji_request_free(a);
    taiji_request_free(b);
    // The refused barrier took no version of its name.
    taiji_request_t* barrier = nullptr;
    failures.expect_status(rank, "barrier after the group", taiji_barrier(peer, "held/barrier", &opt, &barrier),
                           TAIJI_OK);
    if (barrier != nullptr) {
      failures.expect_status(rank, "wait barrier", wait_bounded(peer, barrier, 10000, failures, rank, "barrier"),
                             TAIJI_OK);
      failures.expect(rank, taiji_request_version(barrier) == 1,
                      "barrier version " + std::to_string(taiji_request_version(barrier)));
      taiji_request_free(barrier);
    }
  }));
  check_no_failures(failures);
}

TEST_CASE("group: finalize and abort fail the ops an open group holds", "[group]") {
  for (bool abort : {false, true}) {
    CAPTURE(abort);
    Failures failures;
    PeerOptions options;
    options.finalize_ok = [](int, taiji_status_t) { return true; };
    failures.add_all(run_peers(1, [&](taiji_peer_t* peer, int rank) {
      taiji_op_options_t opt = op_options(10000);
      std::vector<float> buf(64, 1.0f);
      CallbackLog log;
      opt.callback = record_callback;
      opt.user_data = &log;
      taiji_request_t* req = nullptr;
      failures.expect_status(rank, "start", taiji_group_start(peer), TAIJI_OK);
      failures.expect_status(rank, "post",
                             taiji_allreduce(peer, "closing/a", buf.data(), buf.data(), buf.size(), TAIJI_F32,
                                             TAIJI_SUM, &opt, &req),
                             TAIJI_OK);
      if (abort) {
        failures.expect_status(rank, "abort", taiji_peer_abort(peer), TAIJI_OK);
      } else {
        taiji_peer_finalize(peer);
      }
      const taiji_status_t want = abort ? TAIJI_ERR_ABORTED : TAIJI_ERR_FINALIZED;
      failures.expect_status(rank, "held op after close", wait_bounded(peer, req, 10000, failures, rank, "held"),
                             want);
      failures.expect(rank, std::string(taiji_request_error(req)).find("group was still open") != std::string::npos,
                      std::string("held op's error text: ") + taiji_request_error(req));
      failures.expect(rank, await_calls(log, 1, std::chrono::milliseconds(5000)) && log.status.load() == want,
                      "the held op's callback reported " + std::to_string(log.status.load()));
      failures.expect_status(rank, "end after close", taiji_group_end(peer), TAIJI_OK);
      failures.expect_status(rank, "post after close",
                             taiji_allreduce(peer, "closing/b", buf.data(), buf.data(), buf.size(), TAIJI_F32,
                                             TAIJI_SUM, &opt, nullptr),
                             TAIJI_ERR_FINALIZED);
      taiji_request_free(req);
    }, options));
    check_no_failures(failures);
  }
}

TEST_CASE("group: an allreduce with gradient statistics is held like any op; the runtime's own posts are not",
          "[group]") {
  constexpr int n = 2;
  Failures failures;
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_grad_stats_config_t cfg = TAIJI_GRAD_STATS_CONFIG_INIT;
    cfg.batch_size = 8;
    taiji_grad_stats_t* stats = nullptr;
    if (!failures.expect_status(rank, "create", taiji_grad_stats_create(peer, &cfg, &stats), TAIJI_OK)) return;
    std::vector<float> grad(256), plain(64);
    for (int round = 0; round < 3; ++round) {
      for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>((i % 7) + rank + round);
      std::fill(plain.begin(), plain.end(), 1.0f);
      taiji_op_options_t opt = op_options(10000);
      opt.grad_stats = stats;
      taiji_op_options_t plain_opt = op_options(10000);
      taiji_request_t* g = nullptr;
      taiji_request_t* p = nullptr;
      const std::string tag = " round " + std::to_string(round);
      if (round == 0) {
        // Posted in a group: the statistics op's own request is held with it.
        failures.expect_status(rank, "start", taiji_group_start(peer), TAIJI_OK);
        failures.expect_status(rank, "post grad",
                               taiji_allreduce(peer, "gs/w", grad.data(), grad.data(), grad.size(), TAIJI_F32,
                                               TAIJI_SUM, &opt, &g),
                               TAIJI_OK);
        failures.expect_status(rank, "wait on held grad", taiji_request_wait(g, 5000), TAIJI_ERR_INVALID_ARGUMENT);
        failures.expect_status(rank, "end", taiji_group_end(peer), TAIJI_OK);
        failures.expect_status(rank, "grad" + tag, wait_bounded(peer, g, 20000, failures, rank, "grad"), TAIJI_OK);
      } else {
        // Posted outside, then waited inside a group: the statistics' companion ops,
        // posted by whichever thread runs the loop, must not be caught in that group.
        failures.expect_status(rank, "post grad" + tag,
                               taiji_allreduce(peer, "gs/w", grad.data(), grad.data(), grad.size(), TAIJI_F32,
                                               TAIJI_SUM, &opt, &g),
                               TAIJI_OK);
        failures.expect_status(rank, "post plain" + tag,
                               taiji_allreduce(peer, "gs/plain", plain.data(), plain.data(), plain.size(),
                                               TAIJI_F32, TAIJI_SUM, &plain_opt, &p),
                               TAIJI_OK);
        failures.expect_status(rank, "start" + tag, taiji_group_start(peer), TAIJI_OK);
        failures.expect_status(rank, "plain" + tag, wait_bounded(peer, p, 20000, failures, rank, "plain"), TAIJI_OK);
        failures.expect_status(rank, "grad" + tag, wait_bounded(peer, g, 20000, failures, rank, "grad"), TAIJI_OK);
        failures.expect_status(rank, "end" + tag, taiji_group_end(peer), TAIJI_OK);
        failures.expect(rank, plain[0] == static_cast<float>(n), "plain allreduce result" + tag);
      }
      for (size_t i = 0; i < grad.size(); ++i) {
        const float want = static_cast<float>(2 * ((i % 7) + round) + 1);
        if (grad[i] != want) {
          failures.add(rank, "grad" + tag + " element " + std::to_string(i) + ": " + std::to_string(grad[i]));
          break;
        }
      }
      taiji_request_free(g);
      taiji_request_free(p);
    }
    taiji_grad_stats_destroy(stats);
  }));
  check_no_failures(failures);
}

TEST_CASE("group: the element-variance companion keeps its place behind a held topology swap", "[group]") {
  // Rank 0 holds a swap and a statistics allreduce in a group; the others post both
  // outside one. The squares' own allreduce must run after the swap on every rank (three
  // ranks: with two, a ring and the automatic choice are the same graph).
  constexpr int n = 3;
  constexpr size_t count = 64;
  Failures failures;
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_grad_stats_config_t cfg = TAIJI_GRAD_STATS_CONFIG_INIT;
    cfg.batch_size = 8;
    cfg.element_variance = 1;
    taiji_grad_stats_t* stats = nullptr;
    if (!failures.expect_status(rank, "create", taiji_grad_stats_create(peer, &cfg, &stats), TAIJI_OK)) return;
    taiji_topology_t* ring = nullptr;
    if (!failures.expect_status(rank, "ring", taiji_topology_from_text(peer, "ring", 0, &ring), TAIJI_OK)) {
      taiji_grad_stats_destroy(stats);
      return;
    }
    std::vector<double> grad(count);
    for (size_t i = 0; i < count; ++i) grad[i] = static_cast<double>(i % 5 + static_cast<size_t>(rank));
    taiji_op_options_t opt = op_options(10000);
    opt.grad_stats = stats;
    taiji_op_options_t swap_opt = op_options(10000);
    taiji_request_t* swap = nullptr;
    taiji_request_t* g = nullptr;
    if (rank == 0) failures.expect_status(rank, "start", taiji_group_start(peer), TAIJI_OK);
    failures.expect_status(rank, "post swap", taiji_set_topology(peer, ring, &swap_opt, &swap), TAIJI_OK);
    failures.expect_status(rank, "post grad",
                           taiji_allreduce(peer, "gv/w", grad.data(), grad.data(), count, TAIJI_F64, TAIJI_SUM,
                                           &opt, &g),
                           TAIJI_OK);
    if (rank == 0) failures.expect_status(rank, "end", taiji_group_end(peer), TAIJI_OK);
    failures.expect_status(rank, "swap", wait_bounded(peer, swap, 20000, failures, rank, "swap"), TAIJI_OK);
    failures.expect_status(rank, "grad", wait_bounded(peer, g, 20000, failures, rank, "grad"), TAIJI_OK);
    for (size_t i = 0; i < count; ++i) {
      if (grad[i] != static_cast<double>(3 * (i % 5) + 3)) {
        failures.add(rank, "grad element " + std::to_string(i) + ": " + std::to_string(grad[i]));
        break;
      }
    }
    // Element i is a, a + 1, a + 2 on the three ranks: variance 2/3 in every element.
    double l2 = 0, sum = 0;
    failures.expect_status(rank, "variance", taiji_grad_stats_tensor_variance(stats, "gv/w", &l2, &sum), TAIJI_OK);
    failures.expect(rank, std::abs(l2 - 16.0 / 3) < 1e-9 && std::abs(sum - 128.0 / 3) < 1e-9,
                    "variance l2 " + std::to_string(l2) + " sum " + std::to_string(sum));
    taiji_request_free(swap);
    taiji_request_free(g);
    taiji_topology_destroy(ring);
    taiji_grad_stats_destroy(stats);
  }));
  check_no_failures(failures);
}

TEST_CASE("group: destroy without finalize fails held ops", "[group]") {
  taiji_request_t* held = nullptr;
  CallbackLog log;
  PeerOptions options;
  options.finalize = false;
  std::vector<float> buf(32, 1.0f);
  Failures failures;
  failures.add_all(run_peers(1, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options(10000);
    opt.callback = record_callback;
    opt.user_data = &log;
    failures.expect_status(rank, "start", taiji_group_start(peer), TAIJI_OK);
    failures.expect_status(rank, "post",
                           taiji_allreduce(peer, "destroyed/a", buf.data(), buf.data(), buf.size(), TAIJI_F32,
                                           TAIJI_SUM, &opt, &held),
                           TAIJI_OK);
  }, options));
  check_no_failures(failures);
  REQUIRE(held != nullptr);
  // The request outlives its peer; the op ended when the peer went.
  CHECK(taiji_request_test(held) == TAIJI_ERR_ABORTED);
  CHECK(std::string(taiji_request_error(held)).find("group was still open") != std::string::npos);
  CHECK(await_calls(log, 1, std::chrono::milliseconds(5000)));
  CHECK(log.status.load() == TAIJI_ERR_ABORTED);
  taiji_request_free(held);
}

TEST_CASE("group: a thread that exits with a group open leaves no group to a later thread", "[group]") {
  Failures failures;
  taiji_request_t* left = nullptr;
  PeerOptions options;
  options.finalize_ok = [](int, taiji_status_t) { return true; };
  std::vector<float> buf(32, 1.0f);
  failures.add_all(run_peers(1, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options(10000);
    std::thread leaver([&] {
      failures.expect_status(rank, "start", taiji_group_start(peer), TAIJI_OK);
      failures.expect_status(rank, "post",
                             taiji_allreduce(peer, "left/a", buf.data(), buf.data(), buf.size(), TAIJI_F32,
                                             TAIJI_SUM, &opt, &left),
                             TAIJI_OK);
    });
    leaver.join();
    // Later threads (the system may give them the leaver's id) have no group open.
    for (int i = 0; i < 4; ++i) {
      std::thread later([&] {
        failures.expect_status(rank, "later thread's blocking barrier", taiji_barrier(peer, "left/b", &opt, nullptr),
                               TAIJI_OK);
      });
      later.join();
    }
    failures.expect_status(rank, "left op before finalize", taiji_request_test(left), TAIJI_IN_PROGRESS);
    taiji_peer_finalize(peer);
    failures.expect_status(rank, "left op after finalize", wait_bounded(peer, left, 10000, failures, rank, "left"),
                           TAIJI_ERR_FINALIZED);
    taiji_request_free(left);
  }, options));
  check_no_failures(failures);
}
