// Monitoring through the public C API with real peers (threads of this process).
#include <catch2/catch.hpp>

#include <dirent.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../multipeer/harness.h"
#include "json_mini.h"

using taiji_test::Json;
using taiji_test::parse_json;
using taiji_test::run_peers;

namespace {

std::string metrics_text(taiji_peer_t* peer) {
  size_t needed = 0;
  std::string buf(4096, '\0');
  for (;;) {
    taiji_status_t s = taiji_metrics_json(peer, buf.data(), buf.size(), &needed);
    if (s == TAIJI_OK) return buf.substr(0, needed - 1);
    if (needed <= buf.size()) throw std::runtime_error("taiji_metrics_json failed");
    buf.assign(needed + 1024, '\0');
  }
}

Json snapshot(taiji_peer_t* peer) { return parse_json(metrics_text(peer)); }

Json flight(taiji_peer_t* peer) {
  size_t needed = 0;
  taiji_flight_recorder_json(peer, nullptr, 0, &needed);
  std::string buf(needed + 65536, '\0');
  if (taiji_flight_recorder_json(peer, buf.data(), buf.size(), &needed) != TAIJI_OK) {
    throw std::runtime_error("taiji_flight_recorder_json failed");
  }
  return parse_json(buf.substr(0, needed - 1));
}

// Body failures are collected and checked on the test thread (Catch is not thread-safe).
struct Failures {
  std::mutex mu;
  std::vector<std::string> list;
  void add(int rank, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    list.push_back("rank " + std::to_string(rank) + ": " + what);
  }
  void expect(bool ok, int rank, const std::string& what) {
    if (!ok) add(rank, what);
  }
};

void require_clean(const std::vector<std::string>& run, Failures& f) {
  for (const auto& line : run) FAIL_CHECK(line);
  for (const auto& line : f.list) FAIL_CHECK(line);
  f.list.clear();
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

}  // namespace

TEST_CASE("ops posted from many threads while snapshots are taken add up exactly", "[concurrency]") {
  constexpr int kPosters = 4;
  constexpr int kOps = 100;
  constexpr size_t kCount = 256;
  Failures f;
  auto run = run_peers(3, [&](taiji_peer_t* peer, int rank) {
    std::atomic<bool> done{false};
    std::vector<std::thread> readers;
    for (int t = 0; t < 2; ++t) {
      readers.emplace_back([&] {
        uint64_t last = 0;
        while (!done.load()) {
          try {
            Json j = snapshot(peer);
            uint64_t n = j["ops"]["allreduce"]["count"].u64();
            f.expect(n >= last && n <= kPosters * kOps, rank, "count out of order: " + std::to_string(n));
            last = n;
            flight(peer);
          } catch (const std::exception& e) {
            f.add(rank, e.what());
          }
        }
      });
    }
    std::vector<std::thread> posters;
    for (int t = 0; t < kPosters; ++t) {
      posters.emplace_back([&, t] {
        std::vector<float> buf(kCount * kOps, 1.0f);
        std::vector<taiji_request_t*> reqs(kOps, nullptr);
        const std::string name = "grad/" + std::to_string(t);
        for (int i = 0; i < kOps; ++i) {
          float* b = buf.data() + i * kCount;
          if (taiji_allreduce(peer, name.c_str(), b, b, kCount, TAIJI_F32, TAIJI_SUM, nullptr, &reqs[i]) != TAIJI_OK) {
            f.add(rank, "post failed");
            reqs[i] = nullptr;
          }
        }
        for (auto* r : reqs) {
          if (r != nullptr) f.expect(taiji_request_wait(r, 60000) == TAIJI_OK, rank, "allreduce failed");
          taiji_request_free(r);
        }
        f.expect(buf[0] == 3.0f && buf.back() == 3.0f, rank, "wrong sum");
      });
    }
    for (auto& p : posters) p.join();
    done = true;
    for (auto& r : readers) r.join();
    Json j = snapshot(peer);
    f.expect(j["ops"]["allreduce"]["count"].u64() == kPosters * kOps, rank, "final count");
    f.expect(j["ops"]["allreduce"]["errors"].u64() == 0, rank, "errors");
    f.expect(j["ops"]["allreduce"]["bytes"].u64() == kPosters * kOps * kCount * 4, rank, "bytes");
    f.expect(j["names"].array.size() == kPosters, rank, "names");
    for (const Json& n : j["names"].array) {
      f.expect(n["count"].u64() == kOps && n["kind"].string == "allreduce", rank, "per-name count");
    }
    // Every rank exchanges data with rank 0 whatever the graphs (star, tree or ring).
    for (const Json& l : j["links"].array) {
      if (rank != 0 && l["peer"].u64() != 0) continue;
      f.expect(l["bytes_sent"].u64() > 0 && l["bytes_received"].u64() > 0, rank,
               "link bytes with rank " + std::to_string(l["peer"].u64()));
    }
    f.expect(j["links"].array.size() == 2, rank, "two links");
    const double p50 = j["ops"]["allreduce"]["latency_seconds"]["p50"].number;
    f.expect(p50 > 0 && p50 < 60, rank, "p50 " + std::to_string(p50));
  });
  require_clean(run, f);
}

TEST_CASE("the Prometheus endpoint is scraped by a real HTTP client", "[prometheus]") {
  const std::string python = env_or_empty("TAIJI_TEST_PYTHON");
  const std::string script = env_or_empty("TAIJI_TEST_SCRAPE");
  REQUIRE(!python.empty());
  REQUIRE(!script.empty());
  setenv("TAIJI_METRICS_ADDR", "127.0.0.1:0", 1);
  Failures f;
  auto run = run_peers(2, [&](taiji_peer_t* peer, int rank) {
    int32_t v[16] = {};
    for (int i = 0; i < 5; ++i) {
      f.expect(taiji_allreduce(peer, "grad/w", v, v, 16, TAIJI_I32, TAIJI_SUM, nullptr, nullptr) == TAIJI_OK,
               rank, "allreduce");
    }
    for (int i = 0; i < 3; ++i) {
      f.expect(taiji_broadcast(peer, "weights \"b\"", v, 4, TAIJI_I32, 0, nullptr, nullptr) == TAIJI_OK,
               rank, "broadcast");
    }
    char addr[128];
    size_t needed = 0;
    f.expect(taiji_metrics_address(peer, addr, sizeof addr, &needed) == TAIJI_OK, rank, "address");
    const std::string address = addr;
    f.expect(address.rfind("127.0.0.1:", 0) == 0 && address != "127.0.0.1:0", rank, "bound " + address);
    const std::string cmd = "timeout 60 " + python + " " + script + " http://" + address + "/metrics " +
                            std::to_string(rank) + " 5 3 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[512];
    while (p != nullptr && fgets(buf, sizeof buf, p) != nullptr) out += buf;
    int rc = p != nullptr ? pclose(p) : -1;
    f.expect(rc == 0, rank, "scrape failed (" + std::to_string(rc) + "): " + out);
    // Both peers finish scraping before either stops serving.
    f.expect(taiji_barrier(peer, "scraped", nullptr, nullptr) == TAIJI_OK, rank, "barrier");
  });
  unsetenv("TAIJI_METRICS_ADDR");
  require_clean(run, f);
}

TEST_CASE("an op that times out dumps the flight recorder", "[flight]") {
  char tmpl[] = "/tmp/taiji-flight-test-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  setenv("TAIJI_FLIGHT_RECORDER_DIR", dir.c_str(), 1);
  Failures f;
  std::string job;
  auto run = run_peers(2, [&](taiji_peer_t* peer, int rank) {
    float v[4] = {1, 2, 3, 4};
    f.expect(taiji_allreduce(peer, "warm", v, v, 4, TAIJI_F32, TAIJI_SUM, nullptr, nullptr) == TAIJI_OK,
             rank, "warm");
    if (rank == 0) {
      taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
      opt.timeout_ms = 400;
      taiji_status_t s = taiji_allreduce(peer, "lonely", v, v, 4, TAIJI_F32, TAIJI_SUM, &opt, nullptr);
      f.expect(s == TAIJI_ERR_TIMEOUT, rank, std::string("lonely: ") + taiji_status_name(s));
      Json j = flight(peer);
      const Json& last = j["ops"][j["ops"].array.size() - 1];
      f.expect(last["name"].string == "lonely" && last["state"].string == "failed" &&
                   last["status"].string == "timeout",
               rank, "requested dump: " + last["name"].string + " " + last["state"].string);
      f.expect(snapshot(peer)["ops"]["allreduce"]["errors"].u64() == 1, rank, "error counted");
    }
    f.expect(taiji_barrier(peer, "after", nullptr, nullptr) == TAIJI_OK, rank, "barrier");
  });
  unsetenv("TAIJI_FLIGHT_RECORDER_DIR");
  require_clean(run, f);

  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') files.push_back(e->d_name);
    }
    closedir(d);
  }
  REQUIRE(files.size() == 1);  // rank 0's only: nothing timed out on rank 1
  CHECK(files[0].find("-rank0-") != std::string::npos);
  std::ifstream in(dir + "/" + files[0]);
  std::stringstream text;
  text << in.rdbuf();
  Json j = parse_json(text.str());
  CHECK(j["schema_version"].u64() == 1);
  CHECK(j["rank"].u64() == 0);
  CHECK(j["reason"].string.find("allreduce 'lonely' version 1 timed out after 400 ms") == 0);
  const auto& ops = j["ops"].array;
  REQUIRE(ops.size() == 2);
  CHECK(ops[0]["name"].string == "warm");
  CHECK(ops[0]["state"].string == "ok");
  CHECK(ops[0]["kind"].string == "allreduce");
  CHECK(ops[0]["bytes"].u64() == 16);
  CHECK(ops[1]["name"].string == "lonely");
  CHECK(ops[1]["version"].u64() == 1);
  CHECK((ops[1]["state"].string == "failing" || ops[1]["state"].string == "failed"));
  CHECK(ops[1]["status"].string == "timeout");
  CHECK(ops[1]["error"].string.find("timed out") != std::string::npos);
  CHECK(ops[1]["run_seconds"].number >= 0.39);
  std::remove((dir + "/" + files[0]).c_str());
  rmdir(dir.c_str());
}

TEST_CASE("step marks flag a deliberately slow rank as the straggler", "[steps]") {
  Failures f;
  auto run = run_peers(3, [&](taiji_peer_t* peer, int rank) {
    // The median is the slower fast rank's step, so a fast rank is flagged only if it
    // outlasts rank 2, and rank 2 is missed only if a fast rank's step stretches past
    // 2000 / 1.5 ms: both take scheduling delays of over 900 ms.
    for (int step = 0; step < 4; ++step) {
      if (step > 0) std::this_thread::sleep_for(std::chrono::milliseconds(rank == 2 ? 2000 : 400));
      f.expect(taiji_step_mark(peer, nullptr, nullptr) == TAIJI_OK, rank, "step mark");
    }
    Json j = snapshot(peer);
    const Json& steps = j["steps"];
    f.expect(steps["count"].u64() == 3, rank, "steps " + std::to_string(steps["count"].u64()));
    const auto& ranks = steps["ranks"].array;
    f.expect(ranks[2]["straggler"].boolean && ranks[2]["straggler_steps"].u64() == 3, rank,
             "rank 2 flagged");
    f.expect(ranks[0]["straggler_steps"].u64() == 0 && ranks[1]["straggler_steps"].u64() == 0, rank,
             "fast ranks not flagged");
    f.expect(ranks[2]["seconds"].number >= 2.0, rank, "rank 2's step time");
    const double median = steps["median_seconds"].number;
    f.expect(median >= 0.4 && median < 2.0, rank, "median " + std::to_string(median));
    // An asynchronous mark works like any op.
    taiji_request_t* req = nullptr;
    f.expect(taiji_step_mark(peer, nullptr, &req) == TAIJI_OK, rank, "async mark");
    f.expect(taiji_request_wait(req, 60000) == TAIJI_OK, rank, "async mark wait");
    taiji_request_free(req);
    j = snapshot(peer);
    f.expect(j["steps"]["count"].u64() == 4, rank, "async step counted");
    f.expect(j["ops"]["allgather"]["count"].u64() == 5, rank, "step marks are allgathers");
  });
  require_clean(run, f);
}

TEST_CASE("round-trip probes return plausible times for every link", "[rtt]") {
  Failures f;
  auto run = run_peers(3, [&](taiji_peer_t* peer, int rank) {
    for (int round = 1; round <= 2; ++round) {
      taiji_status_t s = taiji_metrics_probe_rtt(peer, 30000);
      f.expect(s == TAIJI_OK, rank, std::string("probe: ") + taiji_peer_last_error(peer));
      Json j = snapshot(peer);
      f.expect(j["links"].array.size() == 2, rank, "two links");
      for (const Json& l : j["links"].array) {
        const double rtt = l["rtt_seconds"].number;
        f.expect(rtt > 0 && rtt < 5, rank, "rtt " + std::to_string(rtt));
        f.expect(l["rtt_min_seconds"].number <= rtt, rank, "min");
        f.expect(l["rtt_probes"].u64() == static_cast<uint64_t>(round), rank, "probes");
      }
    }
    f.expect(taiji_barrier(peer, "probed", nullptr, nullptr) == TAIJI_OK, rank, "barrier");
  });
  require_clean(run, f);
  run = run_peers(1, [&](taiji_peer_t* peer, int rank) {
    f.expect(taiji_metrics_probe_rtt(peer, 1000) == TAIJI_OK, rank, "alone");
    f.expect(taiji_metrics_probe_rtt(peer, 0) == TAIJI_ERR_INVALID_ARGUMENT, rank, "zero timeout");
  });
  require_clean(run, f);
}

TEST_CASE("metrics can be turned off and on; text outputs follow the size rule", "[api]") {
  Failures f;
  auto run = run_peers(2, [&](taiji_peer_t* peer, int rank) {
    int32_t v = 1;
    f.expect(taiji_metrics_set_enabled(peer, 0) == TAIJI_OK, rank, "off");
    for (int i = 0; i < 3; ++i) taiji_allreduce(peer, "x", &v, &v, 1, TAIJI_I32, TAIJI_SUM, nullptr, nullptr);
    f.expect(!snapshot(peer)["enabled"].boolean, rank, "reported off");
    taiji_metrics_set_enabled(peer, 1);
    for (int i = 0; i < 2; ++i) taiji_allreduce(peer, "x", &v, &v, 1, TAIJI_I32, TAIJI_SUM, nullptr, nullptr);
    Json j = snapshot(peer);
    f.expect(j["ops"]["allreduce"]["count"].u64() == 2, rank, "only ops while on");
    f.expect(j["schema_version"].u64() == TAIJI_METRICS_SCHEMA_VERSION && j["size"].u64() == 2 &&
                 j["rank"].u64() == static_cast<uint64_t>(rank),
             rank, "header fields");
    size_t needed = 0;
    f.expect(taiji_metrics_json(peer, nullptr, 0, &needed) == TAIJI_ERR_INVALID_ARGUMENT && needed > 100,
             rank, "size query");
    char small[8] = "keep";
    f.expect(taiji_metrics_json(peer, small, sizeof small, &needed) == TAIJI_ERR_INVALID_ARGUMENT &&
                 std::string(small) == "keep",
             rank, "too small leaves the buffer");
    char addr[4] = "zz";
    f.expect(taiji_metrics_address(peer, addr, sizeof addr, &needed) == TAIJI_OK && needed == 1 &&
                 addr[0] == '\0',
             rank, "no endpoint");
  });
  require_clean(run, f);
  CHECK(taiji_metrics_json(nullptr, nullptr, 0, nullptr) == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(taiji_step_mark(nullptr, nullptr, nullptr) == TAIJI_ERR_INVALID_ARGUMENT);
}
