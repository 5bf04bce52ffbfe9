// The C API's own contract: versions, status names, NULL handling, init's argument and
// configuration errors, a single peer from a clean environment, rank/size, and option
// structs from older callers.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common.h"
#include "harness.h"

extern char** environ;

namespace {

using namespace taiji_test;

// Removes every variable the runtime reads for its configuration, and puts them back at
// the end of the scope. Only for tests that run no peers while it is alive (setenv is not
// safe against concurrent getenv).
class CleanEnvironment {
 public:
  CleanEnvironment() {
    std::vector<std::string> names = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                      "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                      "SLURM_PROCID", "SLURM_NTASKS"};
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry = *e;
      if (entry.rfind("TAIJI_", 0) == 0) names.push_back(entry.substr(0, entry.find('=')));
    }
    for (const std::string& name : names) {
      const char* v = std::getenv(name.c_str());
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      unsetenv(name.c_str());
    }
  }
  ~CleanEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) setenv(name.c_str(), value->c_str(), 1);
    }
  }
  CleanEnvironment(const CleanEnvironment&) = delete;
  CleanEnvironment& operator=(const CleanEnvironment&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

#define TAIJI_TEST_STR2(x) #x
#define TAIJI_TEST_STR(x) TAIJI_TEST_STR2(x)

struct StatusEntry {
  taiji_status_t status;
  int value;
  const char* name;
  const char* text;
};

const StatusEntry kStatuses[] = {
#define TAIJI_TEST_ENTRY(name, value, text) {TAIJI_##name, value, "TAIJI_" #name, text},
    TAIJI_STATUS_LIST(TAIJI_TEST_ENTRY)
#undef TAIJI_TEST_ENTRY
};

}  // namespace

TEST_CASE("api: library and header versions agree", "[api]") {
  CHECK(taiji_version() == static_cast<uint32_t>(TAIJI_VERSION_NUMBER));
  CHECK(TAIJI_VERSION_NUMBER == TAIJI_VERSION_MAJOR * 10000 + TAIJI_VERSION_MINOR * 100 + TAIJI_VERSION_PATCH);
  const std::string expected = TAIJI_TEST_STR(TAIJI_VERSION_MAJOR) "." TAIJI_TEST_STR(
      TAIJI_VERSION_MINOR) "." TAIJI_TEST_STR(TAIJI_VERSION_PATCH);
  REQUIRE(taiji_version_string() != nullptr);
  CHECK(std::string(taiji_version_string()) == expected);
}

TEST_CASE("api: status names and descriptions", "[api]") {
  for (const StatusEntry& e : kStatuses) {
    CAPTURE(e.name);
    CHECK(static_cast<int>(e.status) == e.value);
    REQUIRE(taiji_status_name(e.status) != nullptr);
    REQUIRE(taiji_status_string(e.status) != nullptr);
    CHECK(std::string(taiji_status_name(e.status)) == e.name);
    CHECK(std::string(taiji_status_string(e.status)) == e.text);
  }
  CHECK(TAIJI_OK == 0);
  CHECK(TAIJI_IN_PROGRESS > 0);
  for (int unknown : {2, -20, -1000, 12345}) {
    CAPTURE(unknown);
    const auto s = static_cast<taiji_status_t>(unknown);
    REQUIRE(taiji_status_name(s) != nullptr);
    REQUIRE(taiji_status_string(s) != nullptr);
    CHECK(std::string(taiji_status_name(s)) == "TAIJI_UNKNOWN_STATUS");
    CHECK(std::strlen(taiji_status_string(s)) > 0);
  }
}

TEST_CASE("api: NULL handles", "[api]") {
  taiji_peer_destroy(nullptr);
  taiji_request_free(nullptr);
  CHECK(taiji_peer_rank(nullptr) == -1);
  CHECK(taiji_peer_size(nullptr) == -1);
  REQUIRE(taiji_peer_last_error(nullptr) != nullptr);
  CHECK(taiji_peer_finalize(nullptr) == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(taiji_peer_abort(nullptr) == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(taiji_peer_init(nullptr, nullptr) == TAIJI_ERR_INVALID_ARGUMENT);
}

TEST_CASE("api: init rejects bad configurations with a message", "[api]") {
  CleanEnvironment env;
  int anchor = 0;
  auto* const sentinel = reinterpret_cast<taiji_peer_t*>(&anchor);
  struct Bad {
    const char* what;
    taiji_config_t config;
    std::vector<taiji_status_t> allowed;
  };
  auto config = [](auto&& tweak) {
    taiji_config_t c = TAIJI_CONFIG_INIT;
    tweak(c);
    return c;
  };
  const std::vector<Bad> bad = {
      {"struct_size 0", config([](taiji_config_t& c) { c.struct_size = 0; }),
       {TAIJI_ERR_INVALID_ARGUMENT, TAIJI_ERR_CONFIG}},
      {"size 2 without a rendezvous (rank 0)", config([](taiji_config_t& c) { c.rank = 0; c.size = 2; }),
       {TAIJI_ERR_CONFIG}},
      {"size 2 without a rendezvous (rank 1)", config([](taiji_config_t& c) { c.rank = 1; c.size = 2; }),
       {TAIJI_ERR_CONFIG}},
      {"size 2 without a rank or rendezvous", config([](taiji_config_t& c) { c.size = 2; }), {TAIJI_ERR_CONFIG}},
      {"size 0", config([](taiji_config_t& c) { c.size = 0; }), {TAIJI_ERR_CONFIG}},
      {"rank not below size",
       config([](taiji_config_t& c) { c.rank = 2; c.size = 2; c.rendezvous = "127.0.0.1:1"; }),
       {TAIJI_ERR_CONFIG}},
      {"unknown topology", config([](taiji_config_t& c) { c.topology = "mesh"; }), {TAIJI_ERR_CONFIG}},
      {"rendezvous without a port",
       config([](taiji_config_t& c) { c.rank = 0; c.size = 2; c.rendezvous = "127.0.0.1"; }),
       {TAIJI_ERR_CONFIG}},
      {"negative timeout", config([](taiji_config_t& c) { c.timeout_ms = -5; }),
       {TAIJI_ERR_INVALID_ARGUMENT, TAIJI_ERR_CONFIG}},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.what);
    taiji_peer_t* peer = sentinel;
    taiji_status_t s = taiji_peer_init(&b.config, &peer);
    CAPTURE(taiji_status_name(s));
    CHECK(std::find(b.allowed.begin(), b.allowed.end(), s) != b.allowed.end());
    CHECK(peer == nullptr);
    REQUIRE(taiji_peer_last_error(nullptr) != nullptr);
    CHECK(std::strlen(taiji_peer_last_error(nullptr)) > 0);
    if (peer != nullptr && peer != sentinel) {
      taiji_peer_finalize(peer);
      taiji_peer_destroy(peer);
    }
  }
  // A header newer than the library.
  taiji_peer_t* peer = sentinel;
  CHECK(taiji_peer_init_versioned(TAIJI_VERSION_NUMBER + 1, nullptr, &peer) == TAIJI_ERR_VERSION);
  CHECK(peer == nullptr);
  CHECK(std::strlen(taiji_peer_last_error(nullptr)) > 0);
  peer = sentinel;
  CHECK(taiji_peer_init_versioned(TAIJI_VERSION_NUMBER + 10000, nullptr, &peer) == TAIJI_ERR_VERSION);
  CHECK(peer == nullptr);
}

TEST_CASE("api: a single peer from a clean environment", "[api]") {
  CleanEnvironment env;
  for (bool use_function : {false, true}) {
    CAPTURE(use_function);
    taiji_peer_t* peer = nullptr;
    // The exported function and the version-checking macro are two ways in.
    taiji_status_t s = use_function ? (taiji_peer_init)(nullptr, &peer) : taiji_peer_init(nullptr, &peer);
    INFO(taiji_peer_last_error(nullptr));
    REQUIRE(s == TAIJI_OK);
    REQUIRE(peer != nullptr);
    CHECK(taiji_peer_rank(peer) == 0);
    CHECK(taiji_peer_size(peer) == 1);
    CHECK(taiji_peer_async_error(peer) == TAIJI_OK);
    taiji_op_options_t opt = op_options(10000);
    for (taiji_dtype_t dtype : kAllDtypes) {
      for (taiji_reduce_op_t op : kAllOps) {
        CAPTURE(dtype_name(dtype), op_name(op));
        ReduceCase rc;
        rc.dtype = dtype;
        rc.op = op;
        rc.count = 13;
        rc.salt = salt_of(std::string("single/") + dtype_name(dtype) + op_name(op));
        GuardedBuffer in(rc.count * dtype_size(dtype));
        GuardedBuffer out(in.size());
        fill_input(rc, 0, in.data());
        const std::string name = std::string("single/") + dtype_name(dtype) + "/" + op_name(op);
        REQUIRE(taiji_allreduce(peer, name.c_str(), in.data(), out.data(), rc.count, dtype, op, &opt, nullptr) ==
                TAIJI_OK);
        // A reduction over one peer is a copy, whatever the operator.
        CHECK(std::memcmp(in.data(), out.data(), in.size()) == 0);
        CHECK(out.guard_intact());
      }
    }
    std::vector<uint8_t> bytes(1000);
    fill_bytes(7, bytes.data(), bytes.size());
    std::vector<uint8_t> copy = bytes;
    CHECK(taiji_broadcast(peer, "single/bc", bytes.data(), bytes.size(), TAIJI_U8, 0, &opt, nullptr) == TAIJI_OK);
    CHECK(bytes == copy);
    CHECK(taiji_broadcast(peer, "single/bc-bad-root", bytes.data(), bytes.size(), TAIJI_U8, 1, &opt, nullptr) ==
          TAIJI_ERR_INVALID_ARGUMENT);
    CHECK(taiji_barrier(peer, "single/barrier", &opt, nullptr) == TAIJI_OK);
    taiji_request_t* req = nullptr;
    REQUIRE(taiji_barrier(peer, "single/barrier", &opt, &req) == TAIJI_OK);
    CHECK(taiji_request_wait(req, 10000) == TAIJI_OK);
    CHECK(taiji_request_version(req) == 2);
    taiji_request_free(req);
    CHECK(taiji_peer_finalize(peer) == TAIJI_OK);
    taiji_peer_destroy(peer);
  }
}

TEST_CASE("api: rank and size of every peer", "[api]") {
  const int n = GENERATE(1, 2, 3, 4);
  CAPTURE(n);
  Failures failures;
  std::vector<std::atomic<int>> seen(n);
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    failures.expect(rank, taiji_peer_rank(peer) == rank, "taiji_peer_rank is " + std::to_string(taiji_peer_rank(peer)));
    failures.expect(rank, taiji_peer_size(peer) == n, "taiji_peer_size is " + std::to_string(taiji_peer_size(peer)));
    failures.expect_status(rank, "async error of a healthy peer", taiji_peer_async_error(peer), TAIJI_OK);
    failures.expect(rank, taiji_peer_last_error(peer) != nullptr, "taiji_peer_last_error returned NULL");
    // Ranks are distinct: every rank contributes its own bit.
    uint64_t bit = uint64_t{1} << rank;
    taiji_op_options_t opt = op_options(20000);
    failures.expect_status(rank, "rank bits",
                           taiji_allreduce(peer, "ranks", &bit, &bit, 1, TAIJI_U64, TAIJI_SUM, &opt, nullptr),
                           TAIJI_OK);
    failures.expect(rank, bit == (uint64_t{1} << n) - 1, "ranks are not distinct");
    seen[rank].fetch_add(1);
  });
  failures.add_all(lines);
  for (int r = 0; r < n; ++r) failures.expect(r, seen[r].load() == 1, "body did not run exactly once");
  check_no_failures(failures);
}

namespace {

struct CallCount {
  std::atomic<int> calls{0};
};

void count_call(taiji_status_t, void* user_data) { static_cast<CallCount*>(user_data)->calls.fetch_add(1); }

}  // namespace

TEST_CASE("api: option and config structs from older callers", "[api]") {
  constexpr int n = 2;
  Failures failures;
  PeerOptions options;
  // A config that ends before `topology`: the bad value past its end must not be read.
  options.configure = [](int, taiji_config_t& c) {
    c.struct_size = offsetof(taiji_config_t, topology);
    c.topology = "mesh";
  };
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    CallCount count;
    taiji_op_options_t opt = op_options(20000, "mesh");
    opt.callback = count_call;
    opt.user_data = &count;
    // Ends before `callback`: neither the callback nor the bad topology may be used.
    opt.struct_size = offsetof(taiji_op_options_t, callback);
    int32_t v = rank + 1;
    failures.expect_status(rank, "options ending before callback",
                           taiji_allreduce(peer, "old/short", &v, &v, 1, TAIJI_I32, TAIJI_SUM, &opt, nullptr),
                           TAIJI_OK);
    failures.expect(rank, v == 3, "old/short: wrong sum");
    // Ends before `topology`: the callback is used, the topology is not.
    opt.struct_size = offsetof(taiji_op_options_t, topology);
    failures.expect_status(rank, "options ending before topology",
                           taiji_allreduce(peer, "old/longer", &v, &v, 1, TAIJI_I32, TAIJI_SUM, &opt, nullptr),
                           TAIJI_OK);
    failures.expect(rank, v == 6, "old/longer: wrong sum");
    auto deadline = Clock::now() + std::chrono::seconds(2);
    while (count.calls.load() < 1 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    failures.expect(rank, count.calls.load() == 1,
                    "callbacks ran " + std::to_string(count.calls.load()) + " times, expected 1");
  }, options);
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("api: a failed async op's error text", "[api]") {
  Failures failures;
  std::atomic<bool> waited{false};
  auto lines = run_peers(2, [&](taiji_peer_t* peer, int rank) {
    // Rank 1 never posts "lonely": rank 0's op times out, and its request says so. Rank 1
    // stays until then (leaving would end the op with PeerLost instead).
    if (rank == 1) {
      auto deadline = Clock::now() + std::chrono::seconds(20);
      while (!waited.load() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      failures.expect(rank, waited.load(), "rank 0's wait did not return within 20 s");
      return;
    }
    float x = 1;
    taiji_op_options_t opt = op_options(300);
    taiji_request_t* req = nullptr;
    failures.expect_status(rank, "post", taiji_allreduce(peer, "lonely", &x, &x, 1, TAIJI_F32, TAIJI_SUM, &opt, &req),
                           TAIJI_OK);
    if (req == nullptr) {
      waited.store(true);
      return;
    }
    failures.expect(rank, std::string(taiji_request_error(req)).empty(), "error text before completion");
    failures.expect_status(rank, "wait", taiji_request_wait(req, 20000), TAIJI_ERR_TIMEOUT);
    waited.store(true);
    std::string text = taiji_request_error(req);
    failures.expect(rank, text.find("'lonely' version 1 timed out after 300 ms") != std::string::npos &&
                              text.find("rank(s) 1") != std::string::npos,
                    "error text: " + text);
    taiji_request_free(req);
  });
  failures.add_all(lines);
  CHECK(taiji_request_error(nullptr) == std::string());
  check_no_failures(failures);
}

namespace {

// TCP sockets of this process whose congestion control is `name`.
int sockets_with_congestion(const std::string& name) {
  int found = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    int type = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    char cc[16] = {};
    len = sizeof(cc);
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, &len) == 0 && name == cc) ++found;
  }
  return found;
}

}  // namespace

TEST_CASE("api: TAIJI_TCP_CONGESTION sets every link's congestion control; an unknown one fails init",
          "[api]") {
  // reno is always built in; pick cubic instead where reno is already the default.
  std::string system_default;
  std::ifstream("/proc/sys/net/ipv4/tcp_congestion_control") >> system_default;
  const std::string chosen = system_default == "reno" ? "cubic" : "reno";
  constexpr int n = 3;
  {
    EnvOverride cc("TAIJI_TCP_CONGESTION", chosen.c_str());
    Failures failures;
    std::atomic<int> ready{0};
    std::atomic<bool> counted{false};
    int seen = 0;
    failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
      std::vector<float> in(1000, 1.0f), out(1000, 0.0f);
      taiji_op_options_t opt = op_options();
      failures.expect_status(rank, "allreduce", taiji_allreduce(peer, "cc/sum", in.data(), out.data(), 1000,
                                                              TAIJI_F32, TAIJI_SUM, &opt, nullptr),
                             TAIJI_OK);
      failures.expect(rank, out[0] == n && out[999] == n, "wrong sum");
      // Every peer is connected to every other now; count while none has finalized.
      ++ready;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      if (rank == 0) {
        while (ready < n && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        seen = sockets_with_congestion(chosen);
        counted = true;
      }
      while (!counted && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }));
    check_no_failures(failures);
    // Both ends of each of the n(n-1)/2 links, and every listener.
    CHECK(seen >= n * (n - 1) + n);
  }
  {
    EnvOverride cc("TAIJI_TCP_CONGESTION", "nosuchcc");
    auto lines = run_peers(2, [](taiji_peer_t*, int) {});
    REQUIRE(!lines.empty());
    CHECK(lines.front().find("'nosuchcc' (TAIJI_TCP_CONGESTION)") != std::string::npos);
    CHECK(lines.front().find("tcp_available_congestion_control") != std::string::npos);
  }
}
