// Link measurement through the C API on real peers over loopback: every rank must end with
// the same matrix, compute the same topology from it, and run on it; the measured_topology
// policy must decide and apply the same on every rank; bad options and a missing rank
// must end in an error, never a hang.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "harness.h"

using namespace taiji_test;

namespace {

constexpr int kRanks = 4;

struct MatrixDeleter {
  void operator()(taiji_link_matrix_t* m) const { taiji_link_matrix_destroy(m); }
};
using MatrixPtr = std::unique_ptr<taiji_link_matrix_t, MatrixDeleter>;

// Every entry, bandwidths then latencies, bit for bit.
std::vector<double> entries(const taiji_link_matrix_t* m) {
  const int n = taiji_link_matrix_size(m);
  std::vector<double> out;
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) out.push_back(taiji_link_bandwidth(m, s, d));
  }
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) out.push_back(taiji_link_latency(m, s, d));
  }
  return out;
}

std::string topology_text(const taiji_topology_t* t) {
  std::string text(taiji_topology_text(t, nullptr, 0) + 1, '\0');
  taiji_topology_text(t, text.data(), text.size());
  text.resize(text.size() - 1);
  return text;
}

template <typename T>
struct PerRank {
  std::mutex mu;
  std::map<int, T> by_rank;
  void set(int rank, T v) {
    std::lock_guard<std::mutex> lock(mu);
    by_rank[rank] = std::move(v);
  }
};

template <typename T>
void expect_all_equal(const PerRank<T>& got) {
  REQUIRE(got.by_rank.size() == static_cast<size_t>(kRanks));
  for (const auto& [rank, v] : got.by_rank) {
    INFO("rank " << rank);
    CHECK(v == got.by_rank.at(0));
  }
}

}  // namespace

TEST_CASE("links: every rank measures the same matrix and computes the same topology from it", "[links]") {
  Failures failures;
  PerRank<std::vector<double>> matrices;
  PerRank<std::string> texts;
  auto lines = run_peers(kRanks, [&](taiji_peer_t* peer, int rank) {
    taiji_link_matrix_t* raw = nullptr;
    failures.expect_status(rank, "before any measurement", taiji_peer_links(peer, &raw), TAIJI_OK);
    failures.expect(rank, raw == nullptr, "a matrix before any measurement");
    taiji_measure_options_t o = TAIJI_MEASURE_OPTIONS_INIT;
    o.probe_bytes = 1 << 20;
    o.latency_rounds = 3;
    if (!failures.expect_status(rank, "measure", taiji_measure_links(peer, &o, &raw), TAIJI_OK)) return;
    MatrixPtr m(raw);
    failures.expect(rank, taiji_link_matrix_size(m.get()) == kRanks, "matrix size");
    for (int s = 0; s < kRanks; ++s) {
      for (int d = 0; d < kRanks; ++d) {
        const bool diagonal = s == d;
        const double bw = taiji_link_bandwidth(m.get(), s, d), lat = taiji_link_latency(m.get(), s, d);
        failures.expect(rank, diagonal ? bw == 0 && lat == 0 : bw > 0 && lat > 0,
                        "entry " + std::to_string(s) + "->" + std::to_string(d) + ": bw " + std::to_string(bw) +
                            ", latency " + std::to_string(lat));
      }
    }
    matrices.set(rank, entries(m.get()));
    taiji_link_matrix_t* kept = nullptr;
    failures.expect_status(rank, "kept", taiji_peer_links(peer, &kept), TAIJI_OK);
    MatrixPtr kept_ptr(kept);
    failures.expect(rank, kept != nullptr && entries(kept) == entries(m.get()), "the kept matrix differs");
    const std::string json = metrics_json(peer);
    failures.expect(rank, json.find("taiji_link_bandwidth_bytes_per_second") != std::string::npos,
                    "no link bandwidth in the metrics");

    taiji_topology_t* t = nullptr;
    char why[512];
    if (!failures.expect_status(rank, "optimize", taiji_optimize_topology(peer, m.get(), nullptr, &t, why, sizeof(why)),
                                TAIJI_OK)) {
      return;
    }
    failures.expect(rank, std::strlen(why) > 0, "no explanation");
    texts.set(rank, topology_text(t));
    failures.expect(rank, taiji_predict_allreduce(t, m.get(), 1 << 24) > 0, "no positive prediction");
    taiji_op_options_t opts = TAIJI_OP_OPTIONS_INIT;
    failures.expect_status(rank, "set topology", taiji_set_topology(peer, t, &opts, nullptr), TAIJI_OK);
    taiji_topology_destroy(t);
    std::vector<int32_t> x(4096, rank + 1), y(4096, 0);
    failures.expect_status(rank, "allreduce", taiji_allreduce(peer, "links.after", x.data(), y.data(), x.size(),
                                                              TAIJI_I32, TAIJI_SUM, nullptr, nullptr),
                           TAIJI_OK);
    const int32_t want = kRanks * (kRanks + 1) / 2;
    failures.expect(rank, y.front() == want && y.back() == want, "wrong sum on the measured topology");
  });
  failures.add_all(lines);
  check_no_failures(failures);
  expect_all_equal(matrices);
  expect_all_equal(texts);
}

TEST_CASE("links: options out of range fail at once on every rank", "[links]") {
  Failures failures;
  auto lines = run_peers(kRanks, [&](taiji_peer_t* peer, int rank) {
    taiji_measure_options_t o = TAIJI_MEASURE_OPTIONS_INIT;
    o.probe_bytes = (uint64_t{1} << 30) + 1;
    failures.expect_status(rank, "probe_bytes", taiji_measure_links(peer, &o, nullptr), TAIJI_ERR_INVALID_ARGUMENT);
    o = TAIJI_MEASURE_OPTIONS_INIT;
    o.latency_rounds = 101;
    failures.expect_status(rank, "latency_rounds", taiji_measure_links(peer, &o, nullptr), TAIJI_ERR_INVALID_ARGUMENT);
    o.struct_size = 3;
    failures.expect_status(rank, "struct_size", taiji_measure_links(peer, &o, nullptr), TAIJI_ERR_INVALID_ARGUMENT);
    taiji_link_matrix_t* m = nullptr;
    failures.expect_status(rank, "still none", taiji_peer_links(peer, &m), TAIJI_OK);
    failures.expect(rank, m == nullptr, "a matrix kept from a refused measurement");
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("links: a rank that never measures ends the others' measurement at the deadline", "[links]") {
  Failures failures;
  PeerOptions po;
  // The absent rank's partners may still have a probe in flight to it when it finalizes.
  po.finalize_ok = [](int, taiji_status_t) { return true; };
  auto lines = run_peers(kRanks, [&](taiji_peer_t* peer, int rank) {
    if (rank == 3) return;
    taiji_measure_options_t o = TAIJI_MEASURE_OPTIONS_INIT;
    o.probe_bytes = 4096;
    o.timeout_ms = 1500;
    const auto start = Clock::now();
    const taiji_status_t s = taiji_measure_links(peer, &o, nullptr);
    failures.expect(rank, s == TAIJI_ERR_TIMEOUT || s == TAIJI_ERR_PEER_LOST,
                    "measure without rank 3 gave " + status_text(s));
    failures.expect(rank, ms_since(start) < 1500 + 3000, "measure outlived its deadline");
  }, po);
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("links: measured_topology measures at its first step and decides the same on every rank", "[links]") {
  Failures failures;
  PerRank<std::string> decisions;
  auto lines = run_peers(kRanks, [&](taiji_peer_t* peer, int rank) {
    taiji_adapt_t* e = nullptr;
    if (!failures.expect_status(rank, "create", taiji_adapt_create(peer, &e), TAIJI_OK)) return;
    failures.expect_status(rank, "add", taiji_adapt_add_policy(e, "measured_topology first=0 gain=1 bytes=4194304"),
                           TAIJI_OK);
    std::string log;
    for (int i = 0; i < 3; ++i) {
      taiji_action_t actions[4] = {TAIJI_ACTION_INIT, TAIJI_ACTION_INIT, TAIJI_ACTION_INIT, TAIJI_ACTION_INIT};
      size_t n = 0;
      failures.expect_status(rank, "step", taiji_adapt_step(e, 8, 20000, actions, 4, &n), TAIJI_OK);
      for (size_t k = 0; k < n; ++k) {
        log += std::to_string(i) + ":" + taiji_action_kind_name(actions[k].kind) + " applied=" +
               std::to_string(actions[k].applied) + " topology=" + actions[k].topology + " reason=" +
               actions[k].reason + "\n";
      }
      if (i == 0) failures.expect(rank, n == 1 && actions[0].kind == TAIJI_ACTION_MEASURE_LINKS, "no measurement");
    }
    taiji_link_matrix_t* m = nullptr;
    failures.expect_status(rank, "kept", taiji_peer_links(peer, &m), TAIJI_OK);
    failures.expect(rank, m != nullptr, "the step kept no matrix");
    taiji_link_matrix_destroy(m);
    decisions.set(rank, log);
    taiji_adapt_destroy(e);
  });
  failures.add_all(lines);
  check_no_failures(failures);
  expect_all_equal(decisions);
  CHECK(decisions.by_rank.at(0).rfind("0:measure_links applied=1", 0) == 0);
}

namespace {

// The value of the gauge `name` (without labels) in a metrics JSON document; -1 when absent.
double gauge(const std::string& json, const std::string& name) {
  const std::string key = "{\"name\":\"" + name + "\",\"labels\":{},\"value\":";
  const size_t at = json.find(key);
  return at == std::string::npos ? -1 : std::strtod(json.c_str() + at + key.size(), nullptr);
}

}  // namespace

TEST_CASE("links: background probes stay within their rate and their rows gather into a matrix", "[links]") {
  constexpr uint64_t kRate = 2 << 20, kProbe = 64 << 10;
  constexpr int kRunMs = 1500;
  Failures failures;
  PerRank<std::vector<double>> matrices;
  PeerOptions po;
  std::vector<taiji_config_t> configs(kRanks);
  po.configure = [&](int rank, taiji_config_t& c) {
    taiji_config_set(&c, "TAIJI_LINK_PROBE_RATE", "2M");
    taiji_config_set(&c, "TAIJI_LINK_PROBE_BYTES", "64K");
    configs[static_cast<size_t>(rank)] = c;  // shares the settings, cleared once the peer has its copy
  };
  // Before any peer starts: the time since bounds every peer's probing time from above.
  const auto start = Clock::now();
  auto lines = run_peers(kRanks, [&](taiji_peer_t* peer, int rank) {
    taiji_config_clear(&configs[static_cast<size_t>(rank)]);
    std::this_thread::sleep_for(std::chrono::milliseconds(kRunMs));
    const double sent = gauge(metrics_json(peer), "taiji_link_probe_bytes_sent");
    const double elapsed = ms_since(start) / 1000;
    failures.expect(rank, sent > 0, "no background probe was sent");
    // The bound: the rate over the time run, plus the one probe that may start at once.
    failures.expect(rank, sent <= kRate * elapsed + kProbe,
                    "probes sent " + std::to_string(sent) + " B in about " + std::to_string(elapsed) + " s");
    taiji_measure_options_t o = TAIJI_MEASURE_OPTIONS_INIT;
    o.background = 1;
    taiji_link_matrix_t* raw = nullptr;
    if (!failures.expect_status(rank, "gather", taiji_measure_links(peer, &o, &raw), TAIJI_OK)) return;
    MatrixPtr m(raw);
    for (int s = 0; s < kRanks; ++s) {
      for (int d = 0; d < kRanks; ++d) {
        if (s != d) failures.expect(rank, taiji_link_bandwidth(m.get(), s, d) > 0, "a link never probed");
      }
    }
    matrices.set(rank, entries(m.get()));
  }, po);
  failures.add_all(lines);
  check_no_failures(failures);
  expect_all_equal(matrices);
}
