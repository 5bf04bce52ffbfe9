// Adaptive progress: the spin window's adaptation, the progress knobs, and requests that
// waiters spin on before sleeping (no completion may be missed, whatever the timing).
#include <catch2/catch.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/config.h"
#include "runtime/progress.h"
#include "runtime/request.h"
#include "waiter_race.h"

using namespace taiji;

namespace {

Result<Config> resolve(const std::map<std::string, std::string>& env) {
  return resolve_config(Config{}, [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST_CASE("spin window halves when spinning does not pay, down to a floor", "[progress]") {
  SpinWindow w(160000);
  CHECK(w.ns() == 160000);
  w.missed();
  CHECK(w.ns() == 80000);
  for (int i = 0; i < 20; ++i) w.missed();
  CHECK(w.ns() == 10000);
  w.paid();
  CHECK(w.ns() == 160000);
  SpinWindow none(0);
  none.missed();
  CHECK(none.ns() == 0);
}

TEST_CASE("progress knobs: defaults, values, and errors naming the variable", "[progress]") {
  auto def = resolve({});
  REQUIRE(def.is_ok());
  CHECK(def.value().progress == "adaptive");
  CHECK(def.value().spin_us == 200);

  auto set = resolve({{"TAIJI_PROGRESS", "blocking"}, {"TAIJI_SPIN_US", "0"}});
  REQUIRE(set.is_ok());
  CHECK(set.value().progress == "blocking");
  CHECK(set.value().spin_us == 0);

  auto mode = resolve({{"TAIJI_PROGRESS", "busy"}});
  REQUIRE_FALSE(mode.is_ok());
  CHECK(mode.status().code() == Code::Config);
  CHECK(mode.status().message().find("TAIJI_PROGRESS='busy'") != std::string::npos);

  auto spin = resolve({{"TAIJI_SPIN_US", "2000000"}});
  REQUIRE_FALSE(spin.is_ok());
  CHECK(spin.status().message().find("TAIJI_SPIN_US") != std::string::npos);
  CHECK_FALSE(resolve({{"TAIJI_SPIN_US", "-5"}}).is_ok());

  // An explicit spin_us wins over the environment.
  Config explicit_values;
  explicit_values.spin_us = 50;
  explicit_values.progress = "blocking";
  auto clean = resolve_config(explicit_values, [](const char* name) -> const char* {
    return std::string(name) == "TAIJI_SPIN_US" ? "7" : nullptr;
  });
  REQUIRE(clean.is_ok());
  CHECK(clean.value().spin_us == 50);
  CHECK(clean.value().progress == "blocking");
}

TEST_CASE("a request's test and zero-timeout wait never block and see completion", "[progress]") {
  RequestState r(1, nullptr);
  r.set_spin(1000000, nullptr);
  Status s;
  CHECK_FALSE(r.test(&s));
  CHECK_FALSE(r.wait_for(0, &s));
  r.complete({Code::Timeout, "late"});
  REQUIRE(r.test(&s));
  CHECK(s.code() == Code::Timeout);
  REQUIRE(r.wait_for(0, &s));
  CHECK(s.message() == "late");
  CHECK(std::string(r.error_text()) == "late");
}

TEST_CASE("no waiter misses a completion, spinning or sleeping, under many threads",
          "[progress]") {
  // Each round: every waiter thread waits on its own request while a completer finishes
  // them all in turn. Windows from none to long make waiters go straight to the condition
  // variable or stop spinning right around the moment of completion. (With a loop to
  // run instead of a flag to spin on: test_loop_baton.cpp.)
  const uint64_t windows[] = {0, 1000, 20000, 500000};
  auto race = taiji_test::race_waiters(300, 8, [&](int round, int i, RequestState& r) {
    r.set_spin(windows[(round + i) % 4], nullptr);
  });
  CHECK(race.missed == 0);
  CHECK(race.wrong == 0);
}
