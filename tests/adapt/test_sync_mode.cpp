#include <catch2/catch.hpp>

#include <string>

#include "adapt/sync_mode.h"

using namespace taiji;

TEST_CASE("sync mode names round-trip, asp is pair", "[syncmode]") {
  for (int m = 0; m < kSyncModeCount; ++m) {
    const auto mode = static_cast<SyncMode>(m);
    REQUIRE(parse_sync_mode(sync_mode_name(mode)) == mode);
  }
  REQUIRE(parse_sync_mode("asp") == SyncMode::Pair);
  REQUIRE_FALSE(parse_sync_mode("BSP").has_value());
  REQUIRE_FALSE(parse_sync_mode("").has_value());
  REQUIRE_FALSE(replicas_diverge(SyncMode::Bsp));
  REQUIRE(replicas_diverge(SyncMode::Pair));
}

TEST_CASE("the learning rate scales with the batch one update of the shared model sees", "[syncmode]") {
  // Linear (a parameter server's model): one rank's batch per update outside BSP.
  REQUIRE(lr_scale_for_switch(SyncMode::Bsp, SyncMode::Pair, 8, LrRule::Linear) == Approx(0.125));
  REQUIRE(lr_scale_for_switch(SyncMode::Pair, SyncMode::Bsp, 8, LrRule::Linear) == Approx(8.0));
  REQUIRE(lr_scale_for_switch(SyncMode::Sma, SyncMode::Local, 8, LrRule::Linear) == 1.0);
  REQUIRE(lr_scale_for_switch(SyncMode::Bsp, SyncMode::Bsp, 8, LrRule::Linear) == 1.0);
  // Average (the ranks' average is the model): the averaging divides each step already.
  REQUIRE(lr_scale_for_switch(SyncMode::Bsp, SyncMode::Pair, 8) == 1.0);
  REQUIRE(lr_scale_for_switch(SyncMode::Pair, SyncMode::Bsp, 8, LrRule::Average) == 1.0);
  // Momentum takes the linear factor under either rule.
  REQUIRE(momentum_scale_for_switch(SyncMode::Bsp, SyncMode::Pair, 8) == Approx(0.125));
  REQUIRE(momentum_scale_for_switch(SyncMode::Local, SyncMode::Bsp, 4) == 4.0);
  REQUIRE(parse_lr_rule("linear") == LrRule::Linear);
  REQUIRE(parse_lr_rule("average") == LrRule::Average);
  REQUIRE_FALSE(parse_lr_rule("Linear").has_value());
  REQUIRE(std::string(lr_rule_name(LrRule::Linear)) == "linear");
}

TEST_CASE("QSR period is max(H_base, floor((alpha/lr)^2))", "[syncmode]") {
  REQUIRE(qsr_period(0.1, 0.2, 2) == 4);
  REQUIRE(qsr_period(0.1, 0.05, 2) == 2);
  REQUIRE(qsr_period(0.01, 0.2, 2) == 400);
  REQUIRE(qsr_period(0.0, 0.2, 3) == 3);
  REQUIRE(qsr_period(0.1, 0.2, 0) == 4);
}

TEST_CASE("momentum is scaled at a switch, then ramped back", "[syncmode]") {
  REQUIRE(momentum_after_switch(0.9, 0.25, 0, 10) == Approx(0.225));
  REQUIRE(momentum_after_switch(0.9, 0.25, 5, 10) == Approx(0.5625));
  REQUIRE(momentum_after_switch(0.9, 0.25, 10, 10) == Approx(0.9));
  REQUIRE(momentum_after_switch(0.9, 4.0, 0, 10) == Approx(0.9));  // never above configured
  REQUIRE(momentum_after_switch(0.9, 0.25, 0, 0) == Approx(0.9));
}
