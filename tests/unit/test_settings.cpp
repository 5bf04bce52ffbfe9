// The settings table and its parsers: what resolve_config and taiji_config_set share.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>

#include "runtime/settings.h"

using namespace taiji;

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Parses `value` for the setting `name` into a fresh Config; the error text, "" on success.
std::string parse_error(const std::string& name, const std::string& value, Config* c) {
  const Setting* s = find_setting(name);
  REQUIRE(s != nullptr);
  Status st = parse_setting(*s, value, c);
  if (st.is_ok()) return "";
  CHECK(st.code() == Code::Config);
  return st.message();
}

Config parsed(const std::string& name, const std::string& value) {
  Config c;
  std::string why = parse_error(name, value, &c);
  INFO(why);
  REQUIRE(why.empty());
  return c;
}

std::string rejected(const std::string& name, const std::string& value) {
  Config c;
  std::string why = parse_error(name, value, &c);
  CHECK_FALSE(why.empty());
  // Like the environment's errors, every one names the variable and the value.
  CHECK(contains(why, name + "='" + value.substr(0, 40)));
  return why;
}

}  // namespace

TEST_CASE("settings: one entry per variable, each with a field, a doc and a parsable default",
          "[settings]") {
  std::set<std::string_view> names;
  for (const Setting& s : settings()) {
    CAPTURE(s.name);
    CHECK(names.insert(s.name).second);
    CHECK(s.name.rfind("TAIJI_", 0) == 0);
    CHECK(find_setting(s.name) == &s);
    CHECK_FALSE(s.field.empty());
    CHECK_FALSE(s.doc.empty());
    CHECK((s.def.empty() != s.def_doc.empty() || s.computed_default != nullptr));
    if (!s.def.empty()) {
      Config c;
      CHECK(parse_setting(s, s.def, &c).is_ok());
      CHECK(is_set(s, c));
    }
  }
  CHECK(names.size() == 40);
  CHECK(find_setting("TAIJI_NOT_A_SETTING") == nullptr);
  CHECK(find_setting("RANK") == nullptr);  // other launchers' variables are not keys
}

TEST_CASE("settings: integers are whole decimal strings within their bounds", "[settings]") {
  CHECK(parsed("TAIJI_MAX_NAME_LEN", "64").max_name_len == 64);
  CHECK(parsed("TAIJI_MAX_PENDING_CONNECTIONS", "65536").max_pending_connections == 65536);
  CHECK(parsed("TAIJI_STALL_WARN_MS", "0").stall_warn_ms == 0);
  CHECK(parsed("TAIJI_SPIN_US", "1000000").spin_us == 1000000);
  CHECK(parsed("TAIJI_RANK", "0").rank == 0);
  CHECK(parsed("TAIJI_RENDEZVOUS_PORT", "65535").rendezvous_port == 65535);
  CHECK(contains(rejected("TAIJI_SPIN_US", "1000001"), "is out of range (at most 1000000)"));
  CHECK(contains(rejected("TAIJI_WORLD_SIZE", "0"), "is not a positive integer"));
  CHECK(contains(rejected("TAIJI_RANK", "-1"), "is not a non-negative integer"));
  CHECK(contains(rejected("TAIJI_RENDEZVOUS_PORT", "0"), "is not a positive integer"));
  CHECK(contains(rejected("TAIJI_FLIGHT_RECORDER_SIZE", "1K"), "is not a non-negative integer"));
  CHECK(contains(rejected("TAIJI_MAX_PENDING_CONNECTIONS", "99999999999999999999"), "out of range"));
}

TEST_CASE("settings: byte sizes take K, M, G and their bounds", "[settings]") {
  CHECK(parsed("TAIJI_CHUNK_BYTES", "4K").chunk_bytes == 4096);
  CHECK(parsed("TAIJI_EAGER_BYTES", "1").eager_bytes == 1);
  CHECK(parsed("TAIJI_SHM_RING_BYTES", "16G").shm_ring_bytes == 16ull << 30);
  CHECK(parsed("TAIJI_MAX_PAYLOAD_BYTES", "4294967295").max_payload == 4294967295ull);
  CHECK(contains(rejected("TAIJI_CHUNK_BYTES", "4095"), "is below the minimum 4096 bytes"));
  CHECK(contains(rejected("TAIJI_SHM_RING_BYTES", "63K"), "is not between 65536 and"));
  CHECK(contains(rejected("TAIJI_MAX_PAYLOAD_BYTES", "4G"),
                 "exceeds 4294967295 bytes (4 GiB - 1, the largest socket buffer libuv takes)"));
  CHECK(contains(rejected("TAIJI_FUSION_BUFFER_BYTES", "4MB"), "is not a byte size"));
  CHECK(contains(rejected("TAIJI_UNEXPECTED_BYTES", "0"), "is not a positive byte size"));
}

TEST_CASE("settings: milliseconds are positive, and past a year count as a year", "[settings]") {
  CHECK(parsed("TAIJI_TIMEOUT_MS", "1").timeout_ms == 1);
  CHECK(parsed("TAIJI_INIT_TIMEOUT_MS", "9223372036854775807").init_timeout_ms ==
        365LL * 24 * 3600 * 1000);
  CHECK(contains(rejected("TAIJI_HANDSHAKE_TIMEOUT_MS", "0"), "is not a positive integer"));
  CHECK(contains(rejected("TAIJI_TIMEOUT_MS", "1s"), "is not a positive integer"));
}

TEST_CASE("settings: switches and enums take only their words", "[settings]") {
  CHECK(parsed("TAIJI_FUSION", "on").fusion == 1);
  CHECK(parsed("TAIJI_FUSION", "0").fusion == 0);
  CHECK(parsed("TAIJI_METRICS", "0").metrics == 0);
  CHECK(parsed("TAIJI_RENDEZVOUS_HOST", "1").host_rendezvous == 1);
  CHECK(parsed("TAIJI_LOG_LEVEL", "critical").log_level == "critical");
  CHECK(parsed("TAIJI_PROGRESS", "blocking").progress == "blocking");
  CHECK(contains(rejected("TAIJI_METRICS", "off"), "must be 0 or 1"));
  CHECK(contains(rejected("TAIJI_FUSION", "true"), "must be on, off, 1 or 0"));
  CHECK(contains(rejected("TAIJI_SHM", "Auto"), "shared-memory mode TAIJI_SHM='Auto' is not one of auto, off"));
  CHECK(contains(rejected("TAIJI_LOG_LEVEL", "warning"), "is not one of trace, debug"));
  CHECK(parsed("TAIJI_NCCL", "off").nccl == "off");
  CHECK(contains(rejected("TAIJI_NCCL", "yes"), "NCCL mode TAIJI_NCCL='yes' is not one of auto, on, off"));
}

TEST_CASE("settings: strings are checked where the table says how", "[settings]") {
  CHECK(parsed("TAIJI_RENDEZVOUS", "[::1]:9").rendezvous == "[::1]:9");
  CHECK(parsed("TAIJI_METRICS_ADDR", ":0").metrics_addr == ":0");
  CHECK(parsed("TAIJI_TCP_CONGESTION", "bbr").tcp_congestion == "bbr");
  CHECK(parsed("TAIJI_SECRET_FILE", "/no/such/file").secret_file == "/no/such/file");
  CHECK(contains(rejected("TAIJI_RENDEZVOUS", "h:0"), "is not host:port"));
  CHECK(contains(rejected("TAIJI_METRICS_ADDR", "h:x"), "metrics address TAIJI_METRICS_ADDR='h:x' is not [host:]port"));
  CHECK(contains(rejected("TAIJI_TCP_CONGESTION", "BBR"), "is not a name like cubic or bbr"));
  CHECK(contains(rejected("TAIJI_JOB_ID", std::string(993, 'j')), "is longer than 992 bytes"));
  CHECK(contains(rejected("TAIJI_HOST", std::string(4097, 'h')), "is longer than 4096 bytes"));
  CHECK(parsed("TAIJI_NCCL_LIBRARY", "/opt/nccl/lib/libnccl.so.2").nccl_library == "/opt/nccl/lib/libnccl.so.2");
  CHECK(contains(rejected("TAIJI_NCCL_LIBRARY", std::string(4097, 'l')), "is longer than 4096 bytes"));
}

TEST_CASE("settings: a parsed value is an explicit one; resolution keeps it over the environment",
          "[settings]") {
  Config c = parsed("TAIJI_CHUNK_BYTES", "8K");
  REQUIRE(parse_setting(*find_setting("TAIJI_MAX_NAME_LEN"), "40", &c).is_ok());
  // Static: the lookup's answers must outlive each call.
  EnvLookup env = [](const char* name) -> const char* {
    static const std::map<std::string, std::string> vars = {{"TAIJI_CHUNK_BYTES", "64K"},
                                                            {"TAIJI_MAX_NAME_LEN", "50"},
                                                            {"TAIJI_EAGER_BYTES", "2K"}};
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  Result<Config> r = resolve_config(c, env);
  INFO(r.status().message());
  REQUIRE(r.is_ok());
  CHECK(r.value().chunk_bytes == 8192);
  CHECK(r.value().max_name_len == 40);
  CHECK(r.value().eager_bytes == 2048);
  CHECK(r.value().shm_ring_bytes == 64 * 1024);  // four 8 KiB chunks, raised to the minimum
}
