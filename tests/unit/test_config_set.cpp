// taiji_config_set through the public C API: every variable is a key, bad keys and values
// are refused at the call, and what was set reaches the peer.
#include <catch2/catch.hpp>

#include <taiji/metrics.h>
#include <taiji/taiji.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

namespace {

// A value each key accepts, for a job of one on this host.
const std::map<std::string, std::string> kValid = {
    {"TAIJI_RANK", "0"}, {"TAIJI_WORLD_SIZE", "1"}, {"TAIJI_RENDEZVOUS", "127.0.0.1:1"},
    {"TAIJI_RENDEZVOUS_PORT", "29501"}, {"TAIJI_RENDEZVOUS_HOST", "1"},
    {"TAIJI_LISTEN_HOST", "127.0.0.1"}, {"TAIJI_JOB_ID", "set-job"}, {"TAIJI_TIMEOUT_MS", "5000"},
    {"TAIJI_INIT_TIMEOUT_MS", "5000"}, {"TAIJI_CHUNK_BYTES", "64K"}, {"TAIJI_EAGER_BYTES", "4K"},
    {"TAIJI_UNEXPECTED_BYTES", "8M"}, {"TAIJI_MAX_PAYLOAD_BYTES", "16M"},
    {"TAIJI_MAX_NAME_LEN", "128"}, {"TAIJI_TOPOLOGY", "ring"}, {"TAIJI_HOST", "hostA"},
    {"TAIJI_SHM", "off"}, {"TAIJI_SHM_RING_BYTES", "1M"}, {"TAIJI_TCP_CONGESTION", "reno"},
    {"TAIJI_LOG_LEVEL", "error"}, {"TAIJI_SECRET_FILE", "/nonexistent"},
    {"TAIJI_HANDSHAKE_TIMEOUT_MS", "2000"}, {"TAIJI_MAX_PENDING_CONNECTIONS", "8"},
    {"TAIJI_STALL_WARN_MS", "0"}, {"TAIJI_METRICS", "0"}, {"TAIJI_METRICS_ADDR", "127.0.0.1:0"},
    {"TAIJI_FLIGHT_RECORDER_SIZE", "16"}, {"TAIJI_FLIGHT_RECORDER_DIR", "/tmp"},
    {"TAIJI_PROGRESS", "blocking"}, {"TAIJI_SPIN_US", "0"}, {"TAIJI_FUSION", "on"},
    {"TAIJI_FUSION_MAX_OP_BYTES", "16K"}, {"TAIJI_FUSION_BUFFER_BYTES", "1M"},
};

std::string last_error() { return taiji_peer_last_error(nullptr); }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A config that clears itself, so a failing check leaks nothing.
struct OwnedConfig {
  taiji_config_t c = TAIJI_CONFIG_INIT;
  ~OwnedConfig() { taiji_config_clear(&c); }
};

std::string metrics_address(taiji_peer_t* peer) {
  char buf[128] = {};
  size_t needed = 0;
  REQUIRE(taiji_metrics_address(peer, buf, sizeof(buf), &needed) == TAIJI_OK);
  return buf;
}

}  // namespace

TEST_CASE("config_set: every key takes its variable's text", "[configset]") {
  OwnedConfig cfg;
  for (const auto& [key, value] : kValid) {
    CAPTURE(key, value);
    CHECK(taiji_config_set(&cfg.c, key.c_str(), value.c_str()) == TAIJI_OK);
  }
  CHECK(cfg.c.settings != nullptr);
  // Setting again replaces; an empty or NULL value unsets.
  CHECK(taiji_config_set(&cfg.c, "TAIJI_CHUNK_BYTES", "128K") == TAIJI_OK);
  CHECK(taiji_config_set(&cfg.c, "TAIJI_CHUNK_BYTES", "") == TAIJI_OK);
  CHECK(taiji_config_set(&cfg.c, "TAIJI_CHUNK_BYTES", nullptr) == TAIJI_OK);
  taiji_config_clear(&cfg.c);
  CHECK(cfg.c.settings == nullptr);
  taiji_config_clear(&cfg.c);
  taiji_config_clear(nullptr);
}

TEST_CASE("config_set: unknown keys, bad values and bounds are refused at the call", "[configset]") {
  OwnedConfig cfg;
  CHECK(taiji_config_set(&cfg.c, "TAIJI_CHUNK_SIZE", "1M") == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "unknown configuration key 'TAIJI_CHUNK_SIZE'"));
  CHECK(taiji_config_set(&cfg.c, "RANK", "0") == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(taiji_config_set(&cfg.c, "TAIJI_CHUNK_BYTES", "1.5M") == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "TAIJI_CHUNK_BYTES='1.5M' is not a byte size"));
  CHECK(taiji_config_set(&cfg.c, "TAIJI_CHUNK_BYTES", "2K") == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "TAIJI_CHUNK_BYTES='2K' is below the minimum 4096"));
  CHECK(taiji_config_set(&cfg.c, "TAIJI_MAX_PENDING_CONNECTIONS", "65537") == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "TAIJI_MAX_PENDING_CONNECTIONS='65537' is out of range (at most 65536)"));
  CHECK(taiji_config_set(&cfg.c, "TAIJI_LOG_LEVEL", "loud") == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "TAIJI_LOG_LEVEL='loud' is not one of"));
  CHECK(taiji_config_set(&cfg.c, "TAIJI_FUSION", "yes") == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "TAIJI_FUSION='yes' must be on, off, 1 or 0"));
  // Nothing was stored by a refused call.
  CHECK(cfg.c.settings == nullptr);

  CHECK(taiji_config_set(nullptr, "TAIJI_FUSION", "on") == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(taiji_config_set(&cfg.c, nullptr, "on") == TAIJI_ERR_INVALID_ARGUMENT);
  // A struct from a header without the settings field has nowhere to keep them.
  taiji_config_t old = TAIJI_CONFIG_INIT;
  old.struct_size = offsetof(taiji_config_t, settings);
  CHECK(taiji_config_set(&old, "TAIJI_FUSION", "on") == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "struct_size"));
  CHECK(old.settings == nullptr);
}

TEST_CASE("config_set: init ignores a settings pointer its struct_size cuts short", "[configset]") {
  // An older caller's struct ends inside the field: whatever lies there is not its pointer.
  taiji_config_t cut = TAIJI_CONFIG_INIT;
  std::memset(&cut.settings, 0xA5, sizeof cut.settings);
  cut.struct_size = offsetof(taiji_config_t, settings) + sizeof cut.settings / 2;
  taiji_peer_t* peer = nullptr;
  INFO(last_error());
  REQUIRE(taiji_peer_init(&cut, &peer) == TAIJI_OK);
  CHECK(taiji_peer_size(peer) == 1);
  CHECK(taiji_peer_finalize(peer) == TAIJI_OK);
  taiji_peer_destroy(peer);
}

TEST_CASE("config_set: the set values reach the peer and win over the environment",
          "[configset]") {
  REQUIRE(setenv("TAIJI_MAX_NAME_LEN", "4096", 1) == 0);
  OwnedConfig cfg;
  REQUIRE(taiji_config_set(&cfg.c, "TAIJI_MAX_NAME_LEN", "32") == TAIJI_OK);
  REQUIRE(taiji_config_set(&cfg.c, "TAIJI_METRICS_ADDR", "127.0.0.1:0") == TAIJI_OK);
  taiji_peer_t* peer = nullptr;
  const taiji_status_t init = taiji_peer_init(&cfg.c, &peer);
  unsetenv("TAIJI_MAX_NAME_LEN");
  INFO(last_error());
  REQUIRE(init == TAIJI_OK);
  taiji_config_clear(&cfg.c);  // the peer keeps its own copy

  float x = 1;
  CHECK(taiji_allreduce(peer, std::string(32, 'n').c_str(), &x, &x, 1, TAIJI_F32, TAIJI_SUM,
                        nullptr, nullptr) == TAIJI_OK);
  CHECK(taiji_allreduce(peer, std::string(33, 'n').c_str(), &x, &x, 1, TAIJI_F32, TAIJI_SUM,
                        nullptr, nullptr) == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(contains(metrics_address(peer), "127.0.0.1:"));
  CHECK(taiji_peer_finalize(peer) == TAIJI_OK);
  taiji_peer_destroy(peer);

  // Without the key the metrics endpoint is not served.
  OwnedConfig plain;
  REQUIRE(taiji_peer_init(&plain.c, &peer) == TAIJI_OK);
  CHECK(metrics_address(peer).empty());
  taiji_peer_destroy(peer);
}

TEST_CASE("config_set: a key wins over its struct field; rules between settings fail init",
          "[configset]") {
  OwnedConfig cfg;
  cfg.c.size = 4;  // would need a rank and a rendezvous
  REQUIRE(taiji_config_set(&cfg.c, "TAIJI_WORLD_SIZE", "1") == TAIJI_OK);
  taiji_peer_t* peer = nullptr;
  REQUIRE(taiji_peer_init(&cfg.c, &peer) == TAIJI_OK);
  CHECK(taiji_peer_size(peer) == 1);
  taiji_peer_destroy(peer);

  REQUIRE(taiji_config_set(&cfg.c, "TAIJI_CHUNK_BYTES", "32M") == TAIJI_OK);
  REQUIRE(taiji_config_set(&cfg.c, "TAIJI_MAX_PAYLOAD_BYTES", "16M") == TAIJI_OK);
  CHECK(taiji_peer_init(&cfg.c, &peer) == TAIJI_ERR_CONFIG);
  CHECK(peer == nullptr);
  CHECK(contains(last_error(), "chunk size chunk_bytes=33554432 exceeds the max payload"));
}
