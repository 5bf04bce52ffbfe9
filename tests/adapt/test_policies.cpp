#include <catch2/catch.hpp>

#include "adapt/policies.h"
#include "topology/text.h"

using namespace taiji;

namespace {

StepTable table(int size, std::vector<double> seconds, double samples_each = 32) {
  StepTable t;
  t.size = size;
  t.step_seconds = std::move(seconds);
  t.samples.assign(static_cast<size_t>(size), samples_each);
  t.link_bytes_per_second.assign(static_cast<size_t>(size), 0);
  return t;
}

std::unique_ptr<Policy> make(const std::string& spec) {
  auto p = make_policy(spec);
  REQUIRE(p.is_ok());
  return std::move(p.value());
}

// Steps the engine once on t (its step index and mode filled from the engine).
std::vector<Action> run(Engine& e, StepTable t) {
  t.step = e.steps();
  t.sync_mode = e.sync_mode();
  std::vector<Action> out;
  REQUIRE(e.step(t, &out).is_ok());
  return out;
}

class Fixed final : public Policy {
 public:
  Fixed(std::string name, std::vector<Action> actions) : name_(std::move(name)), actions_(std::move(actions)) {}
  std::string name() const override { return name_; }
  Status on_step(const StepView&, std::vector<Action>* out) override {
    ++calls;
    for (const auto& a : actions_) out->push_back(a);
    return {};
  }
  void reset() override { ++resets; }
  int calls = 0;
  int resets = 0;

 private:
  std::string name_;
  std::vector<Action> actions_;
};

}  // namespace

TEST_CASE("the engine derives the median, stragglers and throughput", "[policies]") {
  Engine e;
  StepTable t = table(4, {0.1, 0.1, 0.4, 0.12}, 10);
  const StepView v = e.derive(t);
  REQUIRE(v.median_seconds == Approx(0.11));
  REQUIRE(v.stragglers == std::vector<bool>{false, false, true, false});
  REQUIRE(v.throughput == Approx(40 / 0.4));
  REQUIRE(v.total_samples == 40);
  REQUIRE(v.times_known);
  t.step_seconds[0] = -1;
  const StepView first = e.derive(t);
  REQUIRE_FALSE(first.times_known);
  REQUIRE(first.throughput == 0);
  REQUIRE(median_of_known({}) == 0);
  REQUIRE(median_of_known({3, -1, 1, 2}) == 2);
}

TEST_CASE("conflicts: one action per kind, the first policy wins, no-ops dropped", "[policies]") {
  Engine e;
  Action pair;
  pair.kind = ActionKind::SetSyncMode;
  pair.mode = SyncMode::Pair;
  Action local = pair;
  local.mode = SyncMode::Local;
  Action bsp = pair;
  bsp.mode = SyncMode::Bsp;  // the current mode: dropped
  Action resize;
  resize.kind = ActionKind::Resize;
  resize.size = 4;  // the current size: dropped
  Action grow = resize;
  grow.size = 6;
  auto first = std::make_unique<Fixed>("first", std::vector<Action>{bsp, resize, pair});
  auto second = std::make_unique<Fixed>("second", std::vector<Action>{local, grow});
  Fixed* f = first.get();
  Fixed* s = second.get();
  e.add(std::move(first));
  e.add(std::move(second));
  const auto out = run(e, table(4, {0.1, 0.1, 0.1, 0.1}));
  REQUIRE(out.size() == 2);
  REQUIRE(out[0].kind == ActionKind::SetSyncMode);
  REQUIRE(out[0].mode == SyncMode::Pair);
  REQUIRE(out[0].policy == "first");
  REQUIRE(out[1].kind == ActionKind::Resize);
  REQUIRE(out[1].size == 6);
  REQUIRE(out[1].policy == "second");
  REQUIRE(e.sync_mode() == SyncMode::Pair);
  REQUIRE(e.total_samples() == 128);
  REQUIRE(e.steps() == 1);
  e.reset();
  REQUIRE(f->resets == 1);
  REQUIRE(s->resets == 1);
  REQUIRE(f->calls == 1);
  REQUIRE(e.sync_mode() == SyncMode::Pair);
  REQUIRE(e.total_samples() == 128);
}

TEST_CASE("spec strings: unknown policies and parameters are refused by name", "[policies]") {
  REQUIRE(make_policy("nope").status().message() ==
          "unknown policy 'nope' (built-ins: sync_switch_offline, sync_switch_online, adaptive_topology, "
          "batch_advice, elastic, measured_topology)");
  REQUIRE(make_policy("sync_switch_online q=1").status().message() ==
          "sync_switch_online: unknown parameter 'q' (known: k, m, lr_rule)");
  REQUIRE(make_policy("sync_switch_online k=abc").status().message() ==
          "sync_switch_online: k 'abc' is not a number");
  REQUIRE(make_policy("sync_switch_online m=0").status().message() ==
          "sync_switch_online: m must be in [1, 1e+06], got 0");
  REQUIRE(make_policy("sync_switch_online m=2.5").status().message() == "sync_switch_online: m must be a whole number");
  REQUIRE(make_policy("sync_switch_online k").status().message() == "sync_switch_online: 'k' is not key=value");
  REQUIRE(make_policy("sync_switch_online lr_rule=sqrt").status().message() ==
          "sync_switch_online: lr_rule must be average or linear, got 'sqrt'");
  REQUIRE(make_policy("sync_switch_online k=2 k=3").status().message() == "sync_switch_online: k given twice");
  REQUIRE(make_policy("sync_switch_offline fraction=0.5").status().message() ==
          "sync_switch_offline: fraction and total_samples are required");
  REQUIRE(make_policy("elastic schedule=10:0").status().message() ==
          "elastic: schedule item '10:0' is not STEP:SIZE with SIZE >= 1");
  REQUIRE(make_policy("adaptive_topology candidates=ring//tree").status().code() == Code::InvalidArgument);
  for (const auto& name : policy_names()) {
    if (name != "sync_switch_offline") REQUIRE(make_policy(name).is_ok());
  }
}

TEST_CASE("sync_switch_offline switches to pair once the fraction of samples is done", "[policies]") {
  Engine e;
  e.add(make("sync_switch_offline fraction=0.25 total_samples=1000"));
  // 4 ranks x 32 samples = 128 a step: 256 is crossed on the second step.
  REQUIRE(run(e, table(4, {0.1, 0.1, 0.1, 0.1})).empty());
  const auto out = run(e, table(4, {0.1, 0.1, 0.1, 0.1}));
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].kind == ActionKind::SetSyncMode);
  REQUIRE(out[0].mode == SyncMode::Pair);
  REQUIRE(out[0].lr_scale == 1);  // lr_rule=average: the averaging divides each step already
  REQUIRE(out[0].reason == "256 of 1000 samples done (fraction 0.25)");
  e.set_sync_mode(SyncMode::Bsp);
  e.reset();
  REQUIRE(run(e, table(4, {0.1, 0.1, 0.1, 0.1})).empty());
}

TEST_CASE("sync_switch_online: m slow steps to pair, m calm steps back to bsp", "[policies]") {
  Engine e;
  e.add(make("sync_switch_online k=1.5 m=3 lr_rule=linear"));
  const auto slow = table(4, {0.1, 0.1, 0.1, 0.2});
  const auto calm = table(4, {0.1, 0.1, 0.1, 0.1});
  REQUIRE(run(e, slow).empty());
  REQUIRE(run(e, slow).empty());
  REQUIRE(run(e, calm).empty());  // the run is broken: count again
  REQUIRE(run(e, slow).empty());
  REQUIRE(run(e, slow).empty());
  auto out = run(e, slow);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].mode == SyncMode::Pair);
  REQUIRE(out[0].lr_scale == 0.25);
  REQUIRE(out[0].reason == "rank 3 slower than 1.5x the median for 3 steps");
  REQUIRE(e.sync_mode() == SyncMode::Pair);
  REQUIRE(run(e, calm).empty());
  REQUIRE(run(e, calm).empty());
  out = run(e, calm);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].mode == SyncMode::Bsp);
  REQUIRE(out[0].lr_scale == 4);
  REQUIRE(out[0].reason == "no straggler for 3 steps");
  // A rank's unknown first step counts for nothing.
  REQUIRE(run(e, table(4, {-1, 0.1, 0.1, 0.9})).empty());
}

TEST_CASE("adaptive_topology: a majority below the reference switches, then remeasures", "[policies]") {
  Engine e;
  e.add(make("adaptive_topology threshold=0.8 window=2 candidates=slow_leaf/ring input=tput"));
  auto with = [](std::vector<double> tput) {
    StepTable t = table(4, {0.1, 0.1, 0.1, 0.1});
    t.input_keys = {"tput"};
    t.inputs = {std::move(tput)};
    return t;
  };
  REQUIRE(run(e, with({100, 100, 100, 100})).empty());
  REQUIRE(run(e, with({100, 100, 100, 100})).empty());
  REQUIRE(run(e, with({70, 70, 100, 100})).empty());  // two of four is no majority
  auto out = run(e, with({70, 70, 100, 10}));
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].kind == ActionKind::SetTopology);
  REQUIRE(out[0].topology == "pairs=1;n=4;R0:-1,0,0,1|B0:-1,0,0,1");
  REQUIRE(out[0].reason == "3 of 4 ranks below 0.8x their reference throughput; slowest rank 3 -> slow_leaf");
  REQUIRE(parse_topology(out[0].topology, 4, {0, 0, 0, 0}).is_ok());
  // A new reference from the slower numbers: the same numbers are no drop.
  REQUIRE(run(e, with({70, 70, 100, 10})).empty());
  REQUIRE(run(e, with({70, 70, 100, 10})).empty());
  REQUIRE(run(e, with({70, 70, 100, 10})).empty());
  out = run(e, with({10, 10, 10, 10}));
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].topology == "ring");
  // Without the input nothing is measured.
  REQUIRE(run(e, table(4, {0.1, 0.1, 0.1, 0.1})).empty());
}

TEST_CASE("tree_text puts the order's last ranks at leaves", "[policies]") {
  REQUIRE(tree_text({2, 0, 1}) == "pairs=1;n=3;R0:2,2,-1|B0:2,2,-1");
  REQUIRE(tree_text({0}) == "pairs=1;n=1;R0:-1|B0:-1");
}

TEST_CASE("batch_advice: the noise scale as the batch, AdaScale's gain as the rate", "[policies]") {
  Engine e;
  e.add(make("batch_advice tolerance=0.25 max_scale=16"));
  StepTable t = table(4, {0.1, 0.1, 0.1, 0.1}, 32);  // cluster batch 128
  REQUIRE(run(e, t).empty());                          // no noise scale yet
  t.noise_scale = 150;                                 // within the tolerance of 128
  REQUIRE(run(e, t).empty());
  t.noise_scale = 512;
  auto out = run(e, t);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].kind == ActionKind::AdviseBatch);
  REQUIRE(out[0].batch_scale == 4);
  REQUIRE(out[0].lr_scale == Approx(5.0 / 2.0));  // (4 + 1) / (4 / 4 + 1)
  REQUIRE(out[0].reason == "noise scale 512 vs cluster batch 128");
  t.noise_scale = 1e9;
  out = run(e, t);
  REQUIRE(out[0].batch_scale == 16);
}

TEST_CASE("elastic: a request from outside, else the schedule", "[policies]") {
  Engine e;
  e.add(make("elastic schedule=2:6,3:4"));
  StepTable t = table(4, {0.1, 0.1, 0.1, 0.1});
  REQUIRE(run(e, t).empty());  // step 0
  t.requested_size = 4;
  REQUIRE(run(e, t).empty());  // step 1: the request is the current size
  auto out = run(e, t);        // step 2: scheduled
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].size == 6);
  REQUIRE(out[0].reason == "scheduled at step 2");
  REQUIRE(run(e, t).empty());  // step 3: scheduled size is the current one
  t.requested_size = 3;
  out = run(e, t);
  REQUIRE(out[0].size == 3);
  REQUIRE(out[0].reason == "size 3 requested");
}

TEST_CASE("elastic: the request is read every poll steps, never with poll=0", "[policies]") {
  Engine e;
  REQUIRE_FALSE(e.wants_requested_size(0));
  e.add(make("elastic poll=3"));
  REQUIRE(e.wants_requested_size(0));
  REQUIRE_FALSE(e.wants_requested_size(1));
  REQUIRE(e.wants_requested_size(3));
  StepTable t = table(4, {0.1, 0.1, 0.1, 0.1});
  t.requested_size = 2;
  REQUIRE(run(e, t).size() == 1);  // step 0
  REQUIRE(run(e, t).empty());      // step 1: not read, whatever the table holds
  REQUIRE(run(e, t).empty());
  REQUIRE(run(e, t)[0].size == 2);  // step 3
  Engine never;
  never.add(make("elastic poll=0 schedule=1:2"));
  REQUIRE_FALSE(never.wants_requested_size(0));
  REQUIRE(run(never, t).empty());
  REQUIRE(run(never, t)[0].reason == "scheduled at step 1");
  REQUIRE(make_policy("elastic every=2").status().message() ==
          "elastic: unknown parameter 'every' (known: schedule, poll)");
}

TEST_CASE("the binary search for the BSP fraction", "[policies]") {
  // Nothing tried: the middle.
  auto r = find_bsp_fraction({}, {}, 0.9, 0.01, 0.125);
  REQUIRE_FALSE(r.done);
  REQUIRE(r.fraction == 0.5);
  // 0.5 matched BSP: try lower.
  r = find_bsp_fraction({0.5}, {0.895}, 0.9, 0.01, 0.125);
  REQUIRE(r.fraction == 0.25);
  // 0.25 fell short: between.
  r = find_bsp_fraction({0.5, 0.25}, {0.895, 0.85}, 0.9, 0.01, 0.125);
  REQUIRE_FALSE(r.done);
  REQUIRE(r.fraction == 0.375);
  // 0.375 fell short too: 0.5 is the answer at this resolution.
  r = find_bsp_fraction({0.5, 0.25, 0.375}, {0.895, 0.85, 0.88}, 0.9, 0.01, 0.125);
  REQUIRE(r.done);
  REQUIRE(r.fraction == 0.5);
  // Everything matches down to the resolution: the smallest good one.
  r = find_bsp_fraction({0.5, 0.25, 0.125}, {0.9, 0.9, 0.9}, 0.9, 0.01, 0.125);
  REQUIRE(r.done);
  REQUIRE(r.fraction == 0.125);
  // 0.5 fell short: above it.
  r = find_bsp_fraction({0.5}, {0.5}, 0.9, 0.01, 0.125);
  REQUIRE(r.fraction == 0.75);
}

TEST_CASE("sync_switch_online judges time per sample when checks span several local steps", "[policies]") {
  Engine e;
  e.set_sync_mode(SyncMode::Pair);
  e.add(make("sync_switch_online k=1.5 m=2"));
  // One second between checks on every rank: the fast ranks took 40 steps of 16 samples,
  // the slow one 10. Raw times are equal; per sample, rank 2 is four times slower.
  StepTable lagging = table(4, {1.0, 1.0, 1.0, 1.0});
  lagging.samples = {640, 640, 160, 640};
  lagging.sync_mode = SyncMode::Pair;
  REQUIRE(run(e, lagging).empty());
  REQUIRE(run(e, lagging).empty());
  REQUIRE(run(e, lagging).empty());  // a straggler persists: pair stays
  StepTable even = lagging;
  even.samples = {640, 640, 620, 640};
  REQUIRE(run(e, even).empty());
  const auto out = run(e, even);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].mode == SyncMode::Bsp);
  REQUIRE(out[0].reason == "no straggler for 2 steps");
}

TEST_CASE("adaptive_topology by default judges each rank's step throughput, and moves the rank whose links fell furthest", "[policies]") {
  Engine e;
  e.add(make("adaptive_topology window=2 candidates=slow_leaf"));
  StepTable fast = table(4, {0.1, 0.1, 0.1, 0.1});
  fast.link_bytes_per_second = {100, 100, 100, 100};
  REQUIRE(run(e, fast).empty());
  REQUIRE(run(e, fast).empty());
  StepTable slow = table(4, {0.4, 0.4, 0.4, 0.4});  // every step four times longer
  slow.link_bytes_per_second = {30, 90, 25, 60};     // rank 2's links fell furthest
  const auto out = run(e, slow);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].kind == ActionKind::SetTopology);
  REQUIRE(out[0].topology == "pairs=1;n=4;R0:-1,0,1,0|B0:-1,0,1,0");  // order 0,1,3,2: 2 a leaf of 1
  REQUIRE(out[0].reason == "4 of 4 ranks below 0.8x their reference throughput; slowest rank 2 -> slow_leaf");
}
