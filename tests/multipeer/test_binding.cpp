// What a language binding needs beyond the collectives: the names and sizes of the enums,
// the process's log as callbacks, and a rendezvous server on a port the system picks.
#include <catch2/catch.hpp>

#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

struct LogLines {
  std::mutex mu;
  std::vector<std::pair<taiji_log_level_t, std::string>> lines;

  size_t count_with(const std::string& text) {
    std::lock_guard<std::mutex> lock(mu);
    size_t n = 0;
    for (const auto& [level, line] : lines) n += line.find(text) != std::string::npos ? 1 : 0;
    return n;
  }
  taiji_log_level_t level_of(const std::string& text) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [level, line] : lines) {
      if (line.find(text) != std::string::npos) return level;
    }
    return static_cast<taiji_log_level_t>(-1);
  }
};

void keep_line(taiji_log_level_t level, const char* message, void* user_data) {
  auto* log = static_cast<LogLines*>(user_data);
  std::lock_guard<std::mutex> lock(log->mu);
  log->lines.emplace_back(level, message);
}

// A blocking topology swap on a one-peer job: logs "topology switched to <name>" at info.
taiji_status_t switch_topology(taiji_peer_t* peer, const char* name) {
  taiji_topology_t* topology = nullptr;
  taiji_status_t s = taiji_topology_from_text(peer, name, 0, &topology);
  if (s != TAIJI_OK) return s;
  taiji_op_options_t opt = op_options(10000);
  s = taiji_set_topology(peer, topology, &opt, nullptr);
  taiji_topology_destroy(topology);
  return s;
}

taiji_peer_t* single_peer() {
  taiji_config_t cfg = TAIJI_CONFIG_INIT;
  cfg.rank = 0;
  cfg.size = 1;
  taiji_peer_t* peer = nullptr;
  if (taiji_peer_init(&cfg, &peer) != TAIJI_OK) return nullptr;
  return peer;
}

// Puts the log back as the process started: stderr, warnings and above.
struct RestoreLog {
  ~RestoreLog() { taiji_set_log_callback(nullptr, TAIJI_LOG_WARN, nullptr); }
};

}  // namespace

TEST_CASE("binding: dtype sizes and names, reduce op names, unknown values", "[binding]") {
  const size_t sizes[] = {4, 8, 2, 2, 1, 1, 4, 4, 8, 8};
  const char* names[] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "u32", "i64", "u64"};
  for (int d = 0; d < 10; ++d) {
    const auto dtype = static_cast<taiji_dtype_t>(d);
    INFO("dtype " << d);
    CHECK(taiji_dtype_size(dtype) == sizes[d]);
    CHECK(std::string(taiji_dtype_name(dtype)) == names[d]);
  }
  for (int bad : {10, -1, 1000}) {
    INFO("dtype " << bad);
    CHECK(taiji_dtype_size(static_cast<taiji_dtype_t>(bad)) == 0);
    CHECK(std::string(taiji_dtype_name(static_cast<taiji_dtype_t>(bad))) == "unknown");
  }
  const char* ops[] = {"sum", "prod", "min", "max", "avg"};
  for (int op = 0; op < 5; ++op) {
    INFO("op " << op);
    CHECK(std::string(taiji_reduce_op_name(static_cast<taiji_reduce_op_t>(op))) == ops[op]);
  }
  for (int bad : {5, -1, 77}) {
    INFO("op " << bad);
    CHECK(std::string(taiji_reduce_op_name(static_cast<taiji_reduce_op_t>(bad))) == "unknown");
  }
}

TEST_CASE("binding: the log callback gets each line with its level, filtered; NULL restores stderr",
          "[binding]") {
  RestoreLog restore;
  LogLines log;
  CHECK(taiji_set_log_callback(keep_line, static_cast<taiji_log_level_t>(-1), &log) == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(taiji_set_log_callback(keep_line, static_cast<taiji_log_level_t>(6), &log) == TAIJI_ERR_INVALID_ARGUMENT);
  taiji_peer_t* peer = single_peer();
  REQUIRE(peer != nullptr);
  // The refused calls changed nothing: the log still goes to stderr.
  REQUIRE(switch_topology(peer, "ring") == TAIJI_OK);
  CHECK(log.count_with("topology switched to") == 0);

  REQUIRE(taiji_set_log_callback(keep_line, TAIJI_LOG_INFO, &log) == TAIJI_OK);
  REQUIRE(switch_topology(peer, "tree") == TAIJI_OK);
  CHECK(log.count_with("topology switched to tree") == 1);
  CHECK(log.level_of("topology switched to tree") == TAIJI_LOG_INFO);
  {
    std::lock_guard<std::mutex> lock(log.mu);
    for (const auto& [level, line] : log.lines) {
      INFO(line);
      CHECK(level >= TAIJI_LOG_INFO);
      CHECK(line.find("info") == std::string::npos);  // the text only, no level or time
    }
  }

  // Below the level: dropped.
  REQUIRE(taiji_set_log_callback(keep_line, TAIJI_LOG_WARN, &log) == TAIJI_OK);
  REQUIRE(switch_topology(peer, "star") == TAIJI_OK);
  CHECK(log.count_with("topology switched to star") == 0);

  // NULL: back to stderr; the callback is not called again.
  REQUIRE(taiji_set_log_callback(nullptr, TAIJI_LOG_INFO, nullptr) == TAIJI_OK);
  REQUIRE(switch_topology(peer, "clique") == TAIJI_OK);
  CHECK(log.count_with("topology switched to clique") == 0);

  // A peer created later keeps the level the callback set.
  REQUIRE(taiji_set_log_callback(keep_line, TAIJI_LOG_INFO, &log) == TAIJI_OK);
  taiji_peer_t* later = single_peer();
  REQUIRE(later != nullptr);
  REQUIRE(switch_topology(later, "binary_tree") == TAIJI_OK);
  CHECK(log.count_with("topology switched to binary_tree") == 1);
  taiji_peer_destroy(later);
  CHECK(taiji_peer_finalize(peer) == TAIJI_OK);
  taiji_peer_destroy(peer);
}

TEST_CASE("binding: a rendezvous server on a port the system picks bootstraps a job", "[binding]") {
  taiji_rendezvous_t* server = nullptr;
  REQUIRE(taiji_rendezvous_start("127.0.0.1:0", &server) == TAIJI_OK);
  REQUIRE(server != nullptr);
  const size_t len = taiji_rendezvous_address(server, nullptr, 0);
  std::string address(len, '\0');
  REQUIRE(taiji_rendezvous_address(server, address.data(), len + 1) == len);
  INFO("address " << address);
  REQUIRE(address.rfind("127.0.0.1:", 0) == 0);
  CHECK(std::stoi(address.substr(10)) > 0);
  char cut[6];
  CHECK(taiji_rendezvous_address(server, cut, sizeof(cut)) == len);
  CHECK(std::string(cut) == address.substr(0, 5));

  constexpr int n = 2;
  Failures failures;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      taiji_config_t cfg = TAIJI_CONFIG_INIT;
      cfg.rank = rank;
      cfg.size = n;
      cfg.rendezvous = address.c_str();
      cfg.host_rendezvous = 0;
      cfg.listen_host = "127.0.0.1";
      cfg.job_id = "binding-rendezvous";
      cfg.init_timeout_ms = 20000;
      taiji_peer_t* peer = nullptr;
      taiji_status_t s = taiji_peer_init(&cfg, &peer);
      if (!failures.expect_status(rank, std::string("init: ") + taiji_peer_last_error(nullptr), s, TAIJI_OK)) {
        return;
      }
      int64_t in = 5 + rank, out = -1;
      taiji_op_options_t opt = op_options(20000);
      failures.expect_status(rank, "allreduce",
                             taiji_allreduce(peer, "sum", &in, &out, 1, TAIJI_I64, TAIJI_SUM, &opt, nullptr),
                             TAIJI_OK);
      failures.expect(rank, out == 11, "sum " + std::to_string(out));
      failures.expect_status(rank, "finalize", taiji_peer_finalize(peer), TAIJI_OK);
      taiji_peer_destroy(peer);
    });
  }
  for (auto& t : threads) t.join();
  check_no_failures(failures);
  taiji_rendezvous_stop(server);
  taiji_rendezvous_stop(nullptr);
}

TEST_CASE("binding: a bad rendezvous host_port is refused with a reason", "[binding]") {
  taiji_rendezvous_t* server = nullptr;
  CHECK(taiji_rendezvous_start("127.0.0.1:0", nullptr) == TAIJI_ERR_INVALID_ARGUMENT);
  for (const char* bad : {static_cast<const char*>(nullptr), "", "127.0.0.1", "127.0.0.1:", "127.0.0.1:http",
                          "127.0.0.1:65536", "127.0.0.1:-1"}) {
    INFO("host_port " << (bad ? bad : "NULL"));
    server = reinterpret_cast<taiji_rendezvous_t*>(&server);  // must be overwritten
    CHECK(taiji_rendezvous_start(bad, &server) == TAIJI_ERR_INVALID_ARGUMENT);
    CHECK(server == nullptr);
    CHECK(std::strlen(taiji_peer_last_error(nullptr)) > 0);
  }
  CHECK(taiji_rendezvous_address(nullptr, nullptr, 0) == 0);
}
