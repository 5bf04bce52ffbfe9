// Adaptation through the C API on real peers: every rank must return the same actions at
// the same step, from inputs that differ per rank.
#include <catch2/catch.hpp>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "common.h"
#include "harness.h"

using namespace taiji_test;

namespace {

constexpr int kRanks = 4;
constexpr int64_t kStepTimeoutMs = 20000;

struct EngineDeleter {
  void operator()(taiji_adapt_t* e) const { taiji_adapt_destroy(e); }
};
using EnginePtr = std::unique_ptr<taiji_adapt_t, EngineDeleter>;

std::string describe(uint64_t step, const taiji_action_t& a) {
  char line[512];
  std::snprintf(line, sizeof(line), "step %" PRIu64 ": %s mode=%s size=%d topology=%s batch=%a lr=%a by %s (%s)%s",
                step, taiji_action_kind_name(a.kind), taiji_sync_mode_name(a.mode), a.size, a.topology,
                a.batch_scale, a.lr_scale, a.policy, a.reason, a.applied ? " applied" : "");
  return line;
}

// Per rank action logs, compared exactly at the end.
struct Logs {
  std::mutex mu;
  std::map<int, std::vector<std::string>> by_rank;
  void add(int rank, std::string line) {
    std::lock_guard<std::mutex> lock(mu);
    by_rank[rank].push_back(std::move(line));
  }
};

// One step; appends its actions to the log; returns the status.
taiji_status_t step(taiji_adapt_t* e, int rank, uint64_t index, double samples, Logs& logs,
                    std::vector<taiji_action_t>* got = nullptr) {
  std::vector<taiji_action_t> actions(4);
  for (auto& a : actions) a = TAIJI_ACTION_INIT;
  size_t n = 0;
  const taiji_status_t s = taiji_adapt_step(e, samples, kStepTimeoutMs, actions.data(), actions.size(), &n);
  for (size_t i = 0; i < n && i < actions.size(); ++i) {
    logs.add(rank, describe(index, actions[i]));
    if (got != nullptr) got->push_back(actions[i]);
  }
  return s;
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

void expect_same_logs(Logs& logs, const std::vector<std::string>& want) {
  REQUIRE(logs.by_rank.size() == static_cast<size_t>(kRanks));
  for (const auto& [rank, lines] : logs.by_rank) {
    INFO("rank " << rank);
    CHECK(lines == want);
  }
}

// A user policy over per-rank inputs and step times: it advises the sum of every rank's
// "load" as the batch scale and names the slowest rank.
taiji_status_t sum_policy(const taiji_step_view_t* v, taiji_action_list_t* out, void*) {
  if (v->n_inputs != 1 || v->step == 0) return TAIJI_OK;
  double sum = 0;
  for (int r = 0; r < v->size; ++r) sum += v->inputs[r];
  int slowest = 0;
  for (int r = 1; r < v->size; ++r) {
    if (v->step_seconds[r] > v->step_seconds[slowest]) slowest = r;
  }
  char reason[128];
  std::snprintf(reason, sizeof(reason), "%s sums to %g; slowest rank %d", v->input_keys[0], sum, slowest);
  taiji_action_t a = TAIJI_ACTION_INIT;
  a.kind = TAIJI_ACTION_ADVISE_BATCH;
  a.batch_scale = sum;
  a.lr_scale = v->median_seconds > 0 ? 1.0 : 0.0;
  a.reason = reason;
  return taiji_action_list_add(out, &a);
}

}  // namespace

TEST_CASE("adapt: a policy over per-rank inputs decides the same on every rank", "[adapt]") {
  Logs logs;
  Failures failures;
  auto lines = run_peers(kRanks, [&](taiji_peer_t* peer, int rank) {
    taiji_adapt_t* raw = nullptr;
    if (!failures.expect_status(rank, "create", taiji_adapt_create(peer, &raw), TAIJI_OK)) return;
    EnginePtr e(raw);
    failures.expect_status(rank, "add", taiji_adapt_add_callback(e.get(), sum_policy, nullptr), TAIJI_OK);
    for (uint64_t i = 0; i < 5; ++i) {
      sleep_ms(10 + 30 * (rank == 2 ? 1 : 0));
      taiji_adapt_set_input(e.get(), "load", rank + 0.25 * static_cast<double>(i));
      failures.expect_status(rank, "step " + std::to_string(i), step(e.get(), rank, i, 8, logs), TAIJI_OK);
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
  std::vector<std::string> want;
  for (uint64_t i = 1; i < 5; ++i) {
    taiji_action_t a = TAIJI_ACTION_INIT;
    a.kind = TAIJI_ACTION_ADVISE_BATCH;
    a.batch_scale = 6 + static_cast<double>(i);  // 0 + 1 + 2 + 3 + 4 x 0.25 i
    a.lr_scale = 1;
    a.topology = "";
    a.policy = "callback";
    char reason[128];
    std::snprintf(reason, sizeof(reason), "load sums to %g; slowest rank 2", a.batch_scale);
    a.reason = reason;
    want.push_back(describe(i, a));
  }
  expect_same_logs(logs, want);
}

TEST_CASE("adapt: sync_switch_online goes to pair under a straggler and back after", "[adapt]") {
  Logs logs;
  Failures failures;
  auto lines = run_peers(kRanks, [&](taiji_peer_t* peer, int rank) {
    taiji_adapt_t* raw = nullptr;
    if (!failures.expect_status(rank, "create", taiji_adapt_create(peer, &raw), TAIJI_OK)) return;
    EnginePtr e(raw);
    failures.expect_status(rank, "add", taiji_adapt_add_policy(e.get(), "sync_switch_online k=1.5 m=3"), TAIJI_OK);
    for (uint64_t i = 0; i < 11; ++i) {
      // Rank 1 is five times slower in steps 1 to 5; the others stay 20 ms clear of the
      // straggler line (1.5 x 40 ms + 1 ms), so scheduling noise flags nobody.
      sleep_ms(rank == 1 && i >= 1 && i <= 5 ? 200 : 40);
      failures.expect_status(rank, "step " + std::to_string(i), step(e.get(), rank, i, 16, logs), TAIJI_OK);
      if (i == 3) failures.expect(rank, taiji_adapt_sync_mode(e.get()) == TAIJI_SYNC_PAIR, "not in pair after step 3");
    }
    failures.expect(rank, taiji_adapt_sync_mode(e.get()) == TAIJI_SYNC_BSP, "not back in bsp");
    // The steps went into the metrics as step marks do: ten timed steps (the first only
    // starts the clock), rank 1 flagged in the five it was slow.
    std::string json(1 << 16, '\0');
    size_t needed = 0;
    if (!failures.expect_status(rank, "metrics", taiji_metrics_json(peer, json.data(), json.size(), &needed),
                                TAIJI_OK)) {
      return;
    }
    json.resize(std::strlen(json.c_str()));
    failures.expect(rank, json.find("\"steps\":{\"count\":10,") != std::string::npos, "step count: " + json);
    const size_t one = json.find("{\"rank\":1,\"seconds\":");
    const size_t flagged = json.find("\"straggler_steps\":", one);
    failures.expect(rank, one != std::string::npos && json.compare(flagged, 20, "\"straggler_steps\":5}") == 0,
                    "rank 1's straggler steps: " + json);
  });
  failures.add_all(lines);
  check_no_failures(failures);
  taiji_action_t to_pair = TAIJI_ACTION_INIT;
  to_pair.kind = TAIJI_ACTION_SET_SYNC_MODE;
  to_pair.mode = TAIJI_SYNC_PAIR;
  to_pair.lr_scale = 1;  // lr_rule=average
  to_pair.topology = "";
  to_pair.policy = "sync_switch_online";
  to_pair.reason = "rank 1 slower than 1.5x the median for 3 steps";
  taiji_action_t to_bsp = to_pair;
  to_bsp.mode = TAIJI_SYNC_BSP;
  to_bsp.reason = "no straggler for 3 steps";
  expect_same_logs(logs, {describe(3, to_pair), describe(8, to_bsp)});
}

TEST_CASE("adapt: adaptive_topology switches and the new topology carries the next ops", "[adapt]") {
  Logs logs;
  Failures failures;
  const char* want_text = "pairs=1;n=4;R0:-1,0,0,1|B0:-1,0,0,1";
  auto lines = run_peers(kRanks, [&](taiji_peer_t* peer, int rank) {
    taiji_adapt_t* raw = nullptr;
    if (!failures.expect_status(rank, "create", taiji_adapt_create(peer, &raw), TAIJI_OK)) return;
    EnginePtr e(raw);
    failures.expect_status(
        rank, "add",
        taiji_adapt_add_policy(e.get(), "adaptive_topology threshold=0.8 window=2 candidates=slow_leaf input=tput"),
        TAIJI_OK);
    // Two steps of reference, then ranks 0, 1 and 3 see their throughput fall, 3 most.
    const double after[kRanks] = {50, 50, 100, 20};
    for (uint64_t i = 0; i < 3; ++i) {
      taiji_adapt_set_input(e.get(), "tput", i < 2 ? 100 : after[rank]);
      std::vector<taiji_action_t> got;
      failures.expect_status(rank, "step " + std::to_string(i), step(e.get(), rank, i, 16, logs, &got), TAIJI_OK);
    }
    taiji_topology_t* t = nullptr;
    if (!failures.expect_status(rank, "from_text", taiji_topology_from_text(peer, want_text, kRanks, &t), TAIJI_OK)) {
      return;
    }
    const uint64_t want_digest = taiji_topology_digest(t);
    taiji_topology_destroy(t);
    int32_t in[3] = {rank, 10 * rank, -rank};
    int32_t out[3] = {};
    taiji_op_options_t opt = op_options(kStepTimeoutMs);
    taiji_request_t* req = nullptr;
    if (!failures.expect_status(rank, "allreduce",
                                taiji_allreduce(peer, "after", in, out, 3, TAIJI_I32, TAIJI_SUM, &opt, &req), TAIJI_OK)) {
      return;
    }
    failures.expect_status(rank, "wait", taiji_request_wait(req, kStepTimeoutMs), TAIJI_OK);
    failures.expect(rank, taiji_request_topology_digest(req) == want_digest, "the op after the switch ran elsewhere");
    failures.expect(rank, out[0] == 6 && out[1] == 60 && out[2] == -6, "wrong sum after the switch");
    taiji_request_free(req);
  });
  failures.add_all(lines);
  check_no_failures(failures);
  taiji_action_t a = TAIJI_ACTION_INIT;
  a.kind = TAIJI_ACTION_SET_TOPOLOGY;
  a.topology = want_text;
  a.policy = "adaptive_topology";
  a.reason = "3 of 4 ranks below 0.8x their reference throughput; slowest rank 3 -> slow_leaf";
  a.applied = 1;
  expect_same_logs(logs, {describe(2, a)});
}

TEST_CASE("adapt: other custom input keys fail the step on every rank and change nothing", "[adapt]") {
  Logs logs;
  Failures failures;
  auto lines = run_peers(kRanks, [&](taiji_peer_t* peer, int rank) {
    taiji_adapt_t* raw = nullptr;
    if (!failures.expect_status(rank, "create", taiji_adapt_create(peer, &raw), TAIJI_OK)) return;
    EnginePtr e(raw);
    taiji_adapt_add_callback(
        e.get(),
        [](const taiji_step_view_t* v, taiji_action_list_t* out, void*) {
          taiji_action_t a = TAIJI_ACTION_INIT;
          a.kind = TAIJI_ACTION_ADVISE_BATCH;
          a.batch_scale = static_cast<double>(v->step);
          a.reason = "step";
          return taiji_action_list_add(out, &a);
        },
        nullptr);
    taiji_adapt_set_input(e.get(), "a", 1);
    failures.expect_status(rank, "step 0", step(e.get(), rank, 0, 1, logs), TAIJI_OK);
    // Another key on rank 3, then an extra key on rank 0.
    taiji_adapt_set_input(e.get(), rank == 3 ? "b" : "a", 1);
    taiji_status_t s = step(e.get(), rank, 1, 1, logs);
    failures.expect_status(rank, "step with key b on rank 3", s, TAIJI_ERR_MISMATCH);
    failures.expect(rank, std::string(taiji_peer_last_error(peer)) ==
                              "adapt step: rank 3 set other custom input keys than rank 0 (1 vs 1 keys); every "
                              "rank must set the same keys",
                    std::string("message: ") + taiji_peer_last_error(peer));
    taiji_adapt_set_input(e.get(), "a", 1);
    if (rank == 0) taiji_adapt_set_input(e.get(), "c", 1);
    failures.expect_status(rank, "step with an extra key on rank 0", step(e.get(), rank, 1, 1, logs),
                           TAIJI_ERR_MISMATCH);
    failures.expect(rank, taiji_adapt_sync_mode(e.get()) == TAIJI_SYNC_BSP, "the mode changed");
    taiji_adapt_set_input(e.get(), "a", 1);
    failures.expect_status(rank, "step 1", step(e.get(), rank, 1, 1, logs), TAIJI_OK);
  });
  failures.add_all(lines);
  check_no_failures(failures);
  taiji_action_t a = TAIJI_ACTION_INIT;
  a.kind = TAIJI_ACTION_ADVISE_BATCH;
  a.topology = "";
  a.policy = "callback";
  a.reason = "step";
  a.batch_scale = 0;
  const std::string first = describe(0, a);
  a.batch_scale = 1;  // the failed steps did not count
  expect_same_logs(logs, {first, describe(1, a)});
}

TEST_CASE("adapt: bad specs and arguments are refused with a message", "[adapt]") {
  Failures failures;
  auto lines = run_peers(1, [&](taiji_peer_t* peer, int rank) {
    taiji_adapt_t* raw = nullptr;
    if (!failures.expect_status(rank, "create", taiji_adapt_create(peer, &raw), TAIJI_OK)) return;
    EnginePtr e(raw);
    failures.expect_status(rank, "unknown", taiji_adapt_add_policy(e.get(), "fastest"), TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect(rank, std::string(taiji_peer_last_error(peer)).find("unknown policy 'fastest'") == 0,
                    taiji_peer_last_error(peer));
    failures.expect_status(rank, "bad value", taiji_adapt_add_policy(e.get(), "sync_switch_online k=x"),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect_status(rank, "mode", taiji_adapt_set_sync_mode(e.get(), 7), TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect_status(rank, "key", taiji_adapt_set_input(e.get(), "", 1), TAIJI_ERR_INVALID_ARGUMENT);
    size_t n = 9;
    failures.expect_status(rank, "no actions", taiji_adapt_step(e.get(), 1, 0, nullptr, 0, &n), TAIJI_OK);
    failures.expect(rank, n == 0, "actions from no policy");
    double f = 0;
    int done = 0;
    const double fr[] = {0.5, 0.25};
    const double acc[] = {0.9, 0.8};
    failures.expect_status(rank, "search", taiji_adapt_find_bsp_fraction(fr, acc, 2, 0.9, 0.01, 0.1, &f, &done),
                           TAIJI_OK);
    failures.expect(rank, f == 0.375 && done == 0, "search result");
  });
  failures.add_all(lines);
  check_no_failures(failures);
}
