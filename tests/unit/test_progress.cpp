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
  auto polling = std::make_shared<std::atomic<bool>>(false);
  RequestState r(1, nullptr);
  r.set_spin(1000000, polling);
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
  // them all in turn. The I/O-polling flag flips every round, so waiters alternate
  // between spinning (flag clear) and going straight to the condition variable, and
  // tiny windows make them stop spinning right around the moment of completion.
  constexpr int kWaiters = 8;
  constexpr int kRounds = 300;
  auto polling = std::make_shared<std::atomic<bool>>(false);
  const uint64_t windows[] = {0, 1000, 20000, 500000};
  std::atomic<int> missed{0};
  std::atomic<int> wrong{0};
  for (int round = 0; round < kRounds; ++round) {
    polling->store(round % 2 == 1);
    std::vector<std::shared_ptr<RequestState>> reqs;
    for (int i = 0; i < kWaiters; ++i) {
      reqs.push_back(std::make_shared<RequestState>(static_cast<uint64_t>(i + 1), nullptr));
      reqs.back()->set_spin(windows[(round + i) % 4], polling);
    }
    std::vector<std::thread> waiters;
    for (int i = 0; i < kWaiters; ++i) {
      waiters.emplace_back([&, i] {
        Status s;
        // Bounded: a lost wake-up shows as a timeout, not a hung test.
        if (!reqs[i]->wait_for(10000, &s)) {
          ++missed;
        } else if (s.code() != Code::Mismatch || s.message() != std::to_string(i)) {
          ++wrong;
        }
      });
    }
    std::thread completer([&] {
      for (int i = 0; i < kWaiters; ++i) {
        if ((round + i) % 3 == 0) std::this_thread::yield();
        reqs[i]->complete({Code::Mismatch, std::to_string(i)});
      }
    });
    completer.join();
    for (auto& t : waiters) t.join();
    if (missed > 0 || wrong > 0) break;
  }
  CHECK(missed == 0);
  CHECK(wrong == 0);
}
