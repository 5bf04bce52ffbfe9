// The measured_topology policy: when it asks the runtime to measure the links.
#include <catch2/catch.hpp>

#include "adapt/policies.h"

using namespace taiji;

namespace {

// A step of 4 ranks, each training 32 samples in `seconds`.
StepTable uniform(uint64_t step, double seconds) {
  StepTable t;
  t.step = step;
  t.size = 4;
  t.step_seconds.assign(4, seconds);
  t.samples.assign(4, 32);
  t.link_bytes_per_second.assign(4, 0);
  return t;
}

// The steps (0-based) at which the policy asked for a measurement, over these step times.
std::vector<uint64_t> measured_at(const std::string& spec, const std::vector<double>& seconds) {
  auto made = make_policy(spec);
  REQUIRE(made.is_ok());
  Engine e;
  e.add(std::move(made.value()));
  std::vector<uint64_t> at;
  for (uint64_t i = 0; i < seconds.size(); ++i) {
    std::vector<Action> out;
    REQUIRE(e.step(uniform(i, seconds[i]), &out).is_ok());
    for (const Action& a : out) {
      REQUIRE(a.kind == ActionKind::MeasureLinks);
      CHECK(a.policy == "measured_topology");
      at.push_back(i);
    }
  }
  return at;
}

}  // namespace

TEST_CASE("measured_topology: first measurement, then none while throughput holds", "[policies]") {
  CHECK(measured_at("measured_topology", std::vector<double>(20, 0.1)) == std::vector<uint64_t>{0});
  CHECK(measured_at("measured_topology first=3", std::vector<double>(20, 0.1)) == std::vector<uint64_t>{3});
  CHECK(measured_at("measured_topology first=-1", std::vector<double>(20, 0.1)).empty());
}

TEST_CASE("measured_topology: a schedule", "[policies]") {
  CHECK(measured_at("measured_topology every=5", std::vector<double>(16, 0.1)) ==
        std::vector<uint64_t>{0, 5, 10, 15});
}

TEST_CASE("measured_topology: a drop that lasts two steps measures again; a hiccup does not", "[policies]") {
  // Step 0 measures; step 1 pays for it (skipped); steps 2-6 are the reference window.
  std::vector<double> seconds(20, 0.1);
  seconds[8] = 0.5;  // one slow step: a hiccup
  for (size_t i = 12; i < 20; ++i) seconds[i] = 0.3;
  // Slow from 12: the second slow step in a row (13) acts; 14 pays for the measurement,
  // 15-19 rebuild the reference at the new speed, so nothing more follows.
  CHECK(measured_at("measured_topology window=5 threshold=0.8", seconds) == std::vector<uint64_t>{0, 13});
}

TEST_CASE("measured_topology: the action carries the gain and size", "[policies]") {
  auto made = make_policy("measured_topology gain=1.5 bytes=1048576");
  REQUIRE(made.is_ok());
  Engine e;
  e.add(std::move(made.value()));
  std::vector<Action> out;
  REQUIRE(e.step(uniform(0, 0.1), &out).is_ok());
  REQUIRE(out.size() == 1);
  CHECK(out[0].min_gain == 1.5);
  CHECK(out[0].bytes == 1048576);
  CHECK(std::string(action_kind_name(out[0].kind)) == "measure_links");
}

TEST_CASE("measured_topology: bad parameters are refused by name", "[policies]") {
  for (const char* spec : {"measured_topology gain=0.5", "measured_topology first=1.5", "measured_topology bytes=0",
                           "measured_topology threshold=2", "measured_topology window=0", "measured_topology speed=1"}) {
    INFO(spec);
    auto made = make_policy(spec);
    REQUIRE_FALSE(made.is_ok());
    CHECK(made.status().code() == Code::InvalidArgument);
    CHECK(made.status().message().rfind("measured_topology: ", 0) == 0);
  }
}
