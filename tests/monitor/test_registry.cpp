// The metrics registry, its writers and the flight recorder, without peers.
#include <catch2/catch.hpp>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "json_mini.h"
#include "monitor/histogram.h"
#include "monitor/metrics.h"
#include "monitor/text_format.h"

using taiji::LatencyHistogram;
using taiji::Metrics;
using taiji::OpStart;
using taiji_test::parse_json;

namespace {

// One op through the lifecycle the I/O thread drives: latency `us` microseconds.
void run_op(Metrics& m, uint8_t kind, const std::string& name, uint64_t bytes, uint64_t us,
            int32_t code = 0) {
  static const std::string strategy = "ring";
  OpStart s{kind, &name, 1, bytes, &strategy, 1000, 1000};
  uint64_t token = m.op_started(s);
  if (code != 0) m.op_failed(token, code, "it failed");
  m.op_ended(token, s, code, code != 0 ? "it failed" : "", 1000 + us * 1000);
}

}  // namespace

TEST_CASE("histogram buckets are inclusive powers of two microseconds", "[registry]") {
  CHECK(LatencyHistogram::bucket_of(0) == 0);
  CHECK(LatencyHistogram::bucket_of(1000) == 0);
  CHECK(LatencyHistogram::bucket_of(1001) == 1);
  CHECK(LatencyHistogram::bucket_of(2000) == 1);
  CHECK(LatencyHistogram::bucket_of(2001) == 2);
  CHECK(LatencyHistogram::bucket_of(1024 * 1000) == 10);
  CHECK(LatencyHistogram::bucket_of(UINT64_MAX / 2) == LatencyHistogram::kFinite);
  LatencyHistogram h;
  for (int i = 0; i < 90; ++i) h.add(3000);   // bucket 2: (2, 4] us
  for (int i = 0; i < 10; ++i) h.add(100000);  // bucket 7: (64, 128] us
  CHECK(h.count() == 100);
  CHECK(h.quantile(0.5) == Approx(2e-6 + 2e-6 * 50.0 / 90.0));
  CHECK(h.quantile(0.95) == Approx(64e-6 + 64e-6 * 5.0 / 10.0));
  CHECK(h.quantile(0.99) == Approx(1e-4));  // never beyond the largest value seen
  CHECK(h.max_seconds() == Approx(1e-4));
  CHECK(h.sum_seconds() == Approx(90 * 3e-6 + 10 * 1e-4));
}

TEST_CASE("ops posted from many threads while others take snapshots add up exactly", "[registry]") {
  Metrics m(0, 4, 64, 16);
  constexpr int kThreads = 6;
  constexpr int kOps = 3000;
  std::atomic<bool> done{false};
  std::atomic<int> snapshots{0};
  std::vector<std::string> errors(2);
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&, t] {
      uint64_t last = 0;
      while (!done.load()) {
        try {
          auto j = parse_json(m.json());
          uint64_t now = j["ops"]["allreduce"]["count"].u64();
          if (now < last) errors[t] = "count went backwards";
          last = now;
          parse_json(m.flight_json("test"));
          if (m.prometheus().find("# TYPE taiji_ops_total counter") == std::string::npos) {
            errors[t] = "no ops family";
          }
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
        snapshots++;
      }
    });
  }
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        // 40 names over a cap of 16: the rest land in "taiji.other".
        run_op(m, i % 2 == 0 ? 1 : 2, "n" + std::to_string((t * kOps + i) % 40), 8, 5,
               i % 100 == 0 ? -3 : 0);
      }
    });
  }
  for (auto& w : writers) w.join();
  done = true;
  for (auto& r : readers) r.join();
  for (const auto& e : errors) CHECK(e == "");
  CHECK(snapshots.load() >= 2);

  auto j = parse_json(m.json());
  const uint64_t total = kThreads * kOps;
  CHECK(j["ops"]["allreduce"]["count"].u64() == total / 2);
  CHECK(j["ops"]["broadcast"]["count"].u64() == total / 2);
  CHECK(j["ops"]["allreduce"]["errors"].u64() == kThreads * kOps / 100);
  CHECK(j["ops"]["allreduce"]["bytes"].u64() == 8 * total / 2);
  CHECK(j["ops"]["barrier"]["count"].u64() == 0);
  const auto& names = j["names"].array;
  REQUIRE(names.size() == 17);
  uint64_t sum = 0;
  for (const auto& n : names) sum += n["count"].u64();
  CHECK(sum == total);
  CHECK(names.back()["name"].string == "taiji.other");
  CHECK(names.back()["count"].u64() == total * 24 / 40);
  CHECK(j["ops"]["allreduce"]["latency_seconds"]["p50"].number == Approx(4e-6 + 4e-6 / 4).epsilon(0.3));
}

TEST_CASE("metrics off counts nothing", "[registry]") {
  Metrics m(0, 1, 8);
  m.set_enabled(false);
  run_op(m, 1, "x", 4, 10);
  m.set_enabled(true);
  run_op(m, 1, "x", 4, 10);
  auto j = parse_json(m.json());
  CHECK(j["ops"]["allreduce"]["count"].u64() == 1);
  CHECK(j["enabled"].boolean);
}

TEST_CASE("the flight recorder keeps the last ops, oldest first, with their states", "[registry]") {
  Metrics m(3, 4, 4);
  for (int i = 0; i < 5; ++i) run_op(m, 1, "op" + std::to_string(i), 64, 100);
  run_op(m, 3, "late \"one\"\n", 0, 200, -3);
  std::string name = "running";
  OpStart s{2, &name, 7, 16, nullptr, 5, 10};
  const uint64_t token = m.op_started(s);
  auto j = parse_json(m.flight_json("asked"));
  CHECK(j["schema_version"].u64() == 1);
  CHECK(j["rank"].u64() == 3);
  CHECK(j["reason"].string == "asked");
  const auto& ops = j["ops"].array;
  REQUIRE(ops.size() == 4);
  CHECK(ops[0]["name"].string == "op3");
  CHECK(ops[0]["seq"].u64() == 4);
  CHECK(ops[0]["state"].string == "ok");
  CHECK(ops[0]["status"].string == "ok");
  CHECK(ops[0]["kind"].string == "allreduce");
  CHECK(ops[0]["bytes"].u64() == 64);
  CHECK(ops[0]["strategy"].string == "ring");
  CHECK(ops[0]["run_seconds"].number == Approx(100e-6));
  CHECK(ops[2]["name"].string == "late \"one\"\n");
  CHECK(ops[2]["kind"].string == "barrier");
  CHECK(ops[2]["state"].string == "failed");
  CHECK(ops[2]["status"].string == "timeout");
  CHECK(ops[2]["error"].string == "it failed");
  CHECK(ops[3]["name"].string == "running");
  CHECK(ops[3]["state"].string == "running");
  CHECK(ops[3]["version"].u64() == 7);
  CHECK(ops[3]["queued_seconds"].number == Approx(5e-9));
  m.op_failed(token, -3, "timed out");
  CHECK(parse_json(m.flight_json(""))["ops"][3]["state"].string == "failing");
}

TEST_CASE("step times flag ranks slower than 1.5 times the median", "[registry]") {
  Metrics m(0, 4, 8);
  CHECK(m.step_end(1'000'000'000) < 0);
  CHECK(m.step_end(1'250'000'000) == Approx(0.25));
  m.record_step({0.1, -1, 0.1, 0.1});  // a rank's first mark: nothing recorded
  CHECK(parse_json(m.json())["steps"]["count"].u64() == 0);
  m.record_step({0.1, 0.12, 0.5, 0.1});
  m.record_step({0.1, 0.12, 0.16, 0.1});
  auto j = parse_json(m.json());
  CHECK(j["steps"]["count"].u64() == 2);
  CHECK(j["steps"]["median_seconds"].number == Approx(0.11));
  const auto& ranks = j["steps"]["ranks"].array;
  CHECK(ranks[2]["seconds"].number == Approx(0.16));
  CHECK(ranks[2]["straggler"].boolean == false);
  CHECK(ranks[2]["straggler_steps"].u64() == 1);
  CHECK(ranks[0]["straggler_steps"].u64() == 0);
  const std::string text = m.prometheus();
  CHECK(text.find("taiji_straggler_steps_total{rank=\"0\",peer=\"2\"} 1\n") != std::string::npos);
  CHECK(text.find("taiji_steps_total{rank=\"0\"} 2\n") != std::string::npos);
}

TEST_CASE("gauges of other components appear in both formats", "[registry]") {
  Metrics m(1, 2, 8);
  CHECK(m.set_gauge("taiji_grad_norm", {{"name", "layer1"}}, 2.5, "Gradient norm."));
  CHECK(m.set_gauge("taiji_grad_norm", {{"name", "layer2"}}, 0.5));
  CHECK(m.set_gauge("taiji_grad_norm", {{"name", "layer1"}}, 3.5));
  CHECK_FALSE(m.set_gauge("bad-name", {}, 1));
  CHECK_FALSE(m.set_gauge("taiji_x", {{"rank", "9"}}, 1));
  CHECK_FALSE(m.set_gauge("taiji_x", {{"a-b", "9"}}, 1));
  auto j = parse_json(m.json());
  REQUIRE(j["gauges"].array.size() == 2);
  CHECK(j["gauges"][0]["labels"]["name"].string == "layer1");
  CHECK(j["gauges"][0]["value"].number == 3.5);
  const std::string text = m.prometheus();
  CHECK(text.find("# HELP taiji_grad_norm Gradient norm.\n# TYPE taiji_grad_norm gauge\n"
                  "taiji_grad_norm{rank=\"1\",name=\"layer1\"} 3.5\n"
                  "taiji_grad_norm{rank=\"1\",name=\"layer2\"} 0.5\n") != std::string::npos);
}

TEST_CASE("gauges per name are bounded like the per-name counters", "[registry]") {
  // max_names 4: at most 4 + kFixedGauges gauges; an existing one can still be set.
  Metrics m(0, 2, 8, 4);
  const size_t cap = 4 + Metrics::kFixedGauges;
  for (size_t i = 0; i < cap; ++i) {
    CHECK(m.set_gauge("taiji_grad_variance_l2", {{"name", "g/step" + std::to_string(i)}}, 1.0));
  }
  CHECK_FALSE(m.set_gauge("taiji_grad_variance_l2", {{"name", "g/one-more"}}, 1.0));
  CHECK(m.set_gauge("taiji_grad_variance_l2", {{"name", "g/step0"}}, 2.0));
  CHECK(parse_json(m.json())["gauges"].array.size() == cap);
}

TEST_CASE("round-trip replies of the current round only are timed", "[registry]") {
  Metrics m(0, 3, 8);
  const uint32_t round = m.rtt_begin();
  m.rtt_sending(round, 1'000'000);
  m.rtt_reply(1, round, 1'500'000);
  m.rtt_reply(1, round, 9'000'000);   // a duplicate is ignored
  m.rtt_reply(2, round + 1, 2'000'000);  // not this round
  taiji::Status s = m.rtt_wait(round, {1, 2}, 50);
  CHECK(s.code() == taiji::Code::Timeout);
  CHECK(s.message().find("rank(s) 2") != std::string::npos);
  m.rtt_reply(2, round, 1'800'000);
  CHECK(m.rtt_wait(round, {1, 2}, 50).is_ok());
  auto j = parse_json(m.json());
  CHECK(j["links"][0]["peer"].u64() == 1);
  CHECK(j["links"][0]["rtt_seconds"].number == Approx(0.0005));
  CHECK(j["links"][1]["rtt_seconds"].number == Approx(0.0008));
  CHECK(j["links"][1]["rtt_probes"].u64() == 1);
}

TEST_CASE("JSON strings escape control characters and invalid UTF-8", "[registry]") {
  std::string out;
  taiji::append_json_string(out, std::string("a\x01\"\\\xff\xc3\xa9", 7));
  CHECK(out == "\"a\\u0001\\\"\\\\\\u00ff\xc3\xa9\"");
  CHECK(parse_json(out).string.size() == 7);
}

TEST_CASE("JSON strings escape overlong forms, surrogates and code points past U+10FFFF",
          "[registry]") {
  // Each of these has the right lead and continuation bits but is not UTF-8 (RFC 3629);
  // strict parsers reject the document if it is copied raw.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\xc0\xaf", "\\u00c0\\u00af"},                  // overlong '/'
      {"\xe0\x80\x80", "\\u00e0\\u0080\\u0080"},       // overlong U+0000
      {"\xed\xa0\x80", "\\u00ed\\u00a0\\u0080"},       // surrogate U+D800
      {"\xf4\x90\x80\x80", "\\u00f4\\u0090\\u0080\\u0080"},  // U+110000
      {"\xf5\x80\x80\x80", "\\u00f5\\u0080\\u0080\\u0080"},
  };
  for (const auto& [raw, escaped] : cases) {
    std::string out;
    taiji::append_json_string(out, raw);
    CHECK(out == "\"" + escaped + "\"");
  }
  // The largest code point and the last ones before the surrogates stay as they are.
  for (std::string ok : {"\xf4\x8f\xbf\xbf", "\xed\x9f\xbf", "\xe0\xa0\x80", "\xf0\x90\x80\x80"}) {
    std::string out;
    taiji::append_json_string(out, ok);
    CHECK(out == "\"" + ok + "\"");
  }
}

TEST_CASE("Prometheus label values stay UTF-8 whatever the op name", "[registry]") {
  std::string out;
  taiji::append_label_value(out, std::string("a\xff\"\\\n\xc3\xa9\xed\xa0\x80", 10));
  // Each byte that is not UTF-8 becomes U+FFFD; the valid é stays.
  CHECK(out == "\"a\xef\xbf\xbd\\\"\\\\\\n\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");
}

TEST_CASE("an op named like the overflow series keeps a series of its own", "[registry]") {
  Metrics m(0, 1, 8, 1);
  run_op(m, 1, "(other)", 4, 10);  // takes the only per-name slot
  run_op(m, 1, "y", 4, 10);        // beyond the cap
  run_op(m, 1, "z", 4, 10);
  auto j = parse_json(m.json());
  const auto& names = j["names"].array;
  REQUIRE(names.size() == 2);
  CHECK(names[0]["name"].string == "(other)");
  CHECK(names[0]["count"].u64() == 1);
  CHECK(names[1]["name"].string == std::string(Metrics::kOtherName));
  CHECK(names[1]["count"].u64() == 2);
  CHECK(names[0]["name"].string != names[1]["name"].string);
  // Every name label appears once per family: a scraper refuses duplicate series.
  const std::string text = m.prometheus();
  CHECK(text.find("name=\"(other)\"} 1") != std::string::npos);
  CHECK(text.find("name=\"taiji.other\"} 2") != std::string::npos);
}

TEST_CASE("shared-memory bytes, read pauses and the early-arrival peak appear in both formats",
          "[registry]") {
  Metrics m(0, 3, 8);
  m.link_counters()[1].add_sent(100);
  m.link_counters()[1].add_shm_sent(40);  // counted in bytes_sent too
  m.link_counters()[2].add_read_pause();
  m.link_counters()[2].add_read_pause();
  m.note_early_bytes(5000);
  m.note_early_bytes(300);  // a peak is kept
  auto j = parse_json(m.json());
  REQUIRE(j["links"].array.size() == 2);
  CHECK(j["links"][0]["bytes_sent"].u64() == 140);
  CHECK(j["links"][0]["shm_bytes_sent"].u64() == 40);
  CHECK(j["links"][0]["read_pauses"].u64() == 0);
  CHECK(j["links"][1]["shm_bytes_sent"].u64() == 0);
  CHECK(j["links"][1]["read_pauses"].u64() == 2);
  CHECK(j["early_arrival_bytes_max"].u64() == 5000);
  const std::string text = m.prometheus();
  CHECK(text.find("taiji_link_shm_sent_bytes_total{rank=\"0\",peer=\"1\"} 40\n") != std::string::npos);
  CHECK(text.find("taiji_link_read_pauses_total{rank=\"0\",peer=\"2\"} 2\n") != std::string::npos);
  CHECK(text.find("taiji_early_arrival_bytes_max{rank=\"0\"} 5000\n") != std::string::npos);
}
