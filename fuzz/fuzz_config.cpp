// resolve_config on an environment (and explicit config fields) built from the input.
//
// Input: lines "NAME=VALUE" (later lines win, as in an environment). NAME is one of the
// variables config.h lists; any other name stands for the listed variable its byte sum
// picks, so every line sets something. "config.FIELD=VALUE" sets an explicit Config field
// instead (integers in decimal; a value that does not parse leaves the field unset).
//
// An accepted configuration must satisfy what config.h and docs/environment.md promise,
// and resolving it again with an empty environment must change nothing. A rejection must
// be Code::Config with a message. Any difference aborts: it is a bug.
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "runtime/config.h"
#include "transport/address.h"

namespace {

using taiji::Config;

// TAIJI_SECRET_FILE is left out: it names a file to read, and inputs must not pick files
// from the machine that runs the fuzzer.
constexpr std::array<std::string_view, 28> kNames = {
    "TAIJI_RANK",          "TAIJI_WORLD_SIZE",        "TAIJI_RENDEZVOUS",
    "TAIJI_RENDEZVOUS_HOST", "TAIJI_RENDEZVOUS_PORT", "RANK",
    "WORLD_SIZE",          "MASTER_ADDR",             "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",   "SLURM_PROCID",
    "SLURM_NTASKS",        "TAIJI_LISTEN_HOST",       "TAIJI_JOB_ID",
    "TAIJI_TIMEOUT_MS",    "TAIJI_INIT_TIMEOUT_MS",   "TAIJI_CHUNK_BYTES",
    "TAIJI_EAGER_BYTES",   "TAIJI_UNEXPECTED_BYTES",  "TAIJI_MAX_PAYLOAD_BYTES",
    "TAIJI_MAX_NAME_LEN",  "TAIJI_TOPOLOGY",          "TAIJI_HOST",
    "TAIJI_LOG_LEVEL",     "TAIJI_HANDSHAKE_TIMEOUT_MS", "TAIJI_MAX_PENDING_CONNECTIONS",
    "TAIJI_STALL_WARN_MS",
};
constexpr std::array<std::string_view, 7> kLogLevels = {"trace", "debug",    "info", "warn",
                                                        "error", "critical", "off"};

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_config: %s\n", what);
    std::abort();
  }
}

std::string_view variable_for(std::string_view name) {
  unsigned sum = 0;
  for (std::string_view known : kNames) {
    if (name == known) return known;
  }
  for (unsigned char c : name) sum += c;
  return kNames[sum % kNames.size()];
}

template <typename T>
void set_number(T* field, std::string_view v) {
  T parsed{};
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), parsed);
  if (ec == std::errc() && end == v.data() + v.size()) *field = parsed;
}

// Explicit fields by their Config member name; unknown fields are ignored.
void set_field(Config* c, std::string_view field, std::string_view v) {
  if (field == "rank") set_number(&c->rank, v);
  else if (field == "size") set_number(&c->size, v);
  else if (field == "host_rendezvous") set_number(&c->host_rendezvous, v);
  else if (field == "timeout_ms") set_number(&c->timeout_ms, v);
  else if (field == "init_timeout_ms") set_number(&c->init_timeout_ms, v);
  else if (field == "chunk_bytes") set_number(&c->chunk_bytes, v);
  else if (field == "eager_bytes") set_number(&c->eager_bytes, v);
  else if (field == "unexpected_bytes") set_number(&c->unexpected_bytes, v);
  else if (field == "max_payload") set_number(&c->max_payload, v);
  else if (field == "max_name_len") set_number(&c->max_name_len, v);
  else if (field == "handshake_timeout_ms") set_number(&c->handshake_timeout_ms, v);
  else if (field == "max_pending_connections") set_number(&c->max_pending_connections, v);
  else if (field == "stall_warn_ms") set_number(&c->stall_warn_ms, v);
  else if (field == "rendezvous") c->rendezvous = v;
  else if (field == "listen_host") c->listen_host = v;
  else if (field == "job_id") c->job_id = v;
  else if (field == "topology") c->topology = v;
  else if (field == "host_label") c->host_label = v;
  else if (field == "log_level") c->log_level = v;
}

bool valid_address(const std::string& s) {
  std::string host;
  uint16_t port = 0;
  return taiji::split_host_port(s, false, &host, &port).empty();
}

bool same(const Config& a, const Config& b) {
  return a.rank == b.rank && a.size == b.size && a.rendezvous == b.rendezvous &&
         a.host_rendezvous == b.host_rendezvous && a.listen_host == b.listen_host &&
         a.job_id == b.job_id && a.timeout_ms == b.timeout_ms &&
         a.init_timeout_ms == b.init_timeout_ms && a.chunk_bytes == b.chunk_bytes &&
         a.eager_bytes == b.eager_bytes && a.unexpected_bytes == b.unexpected_bytes &&
         a.max_payload == b.max_payload && a.max_name_len == b.max_name_len &&
         a.topology == b.topology && a.host_label == b.host_label &&
         a.log_level == b.log_level && a.secret == b.secret &&
         a.handshake_timeout_ms == b.handshake_timeout_ms &&
         a.max_pending_connections == b.max_pending_connections &&
         a.stall_warn_ms == b.stall_warn_ms;
}

void check_resolved(const Config& c) {
  check(c.size >= 1 && c.rank >= 0 && c.rank < c.size, "rank not in [0, size)");
  check(c.host_rendezvous == 0 || c.host_rendezvous == 1, "host_rendezvous not 0 or 1");
  check(c.size == 1 || !c.rendezvous.empty(), "a job of several peers has no rendezvous");
  check(c.rendezvous.empty() || valid_address(c.rendezvous), "rendezvous is not host:port");
  check(!c.listen_host.empty() && !c.job_id.empty() && !c.host_label.empty(),
        "listen_host, job_id or host_label left empty");
  check(c.timeout_ms > 0 && c.init_timeout_ms > 0 && c.handshake_timeout_ms > 0,
        "a timeout is not positive");
  check(c.max_pending_connections > 0, "max_pending_connections is not positive");
  check(c.stall_warn_ms >= 0, "stall_warn_ms is negative");
  check(c.secret_file.empty() && c.secret.empty(), "a secret appeared from nowhere");
  check(c.chunk_bytes >= 4096 && c.chunk_bytes <= c.max_payload,
        "chunk_bytes outside [4 KiB, max_payload]");
  check(c.eager_bytes >= 1 && c.eager_bytes <= c.max_payload,
        "eager_bytes outside [1, max_payload]");
  check(c.unexpected_bytes >= 1, "unexpected_bytes is 0");
  check(c.max_name_len >= 1 && c.max_name_len <= 65535, "max_name_len outside [1, 65535]");
  check(c.job_id.size() <= c.max_name_len, "job id longer than max_name_len");
  // Unset (empty) leaves the process's level alone.
  bool known_level = c.log_level.empty();
  for (std::string_view l : kLogLevels) known_level = known_level || c.log_level == l;
  check(known_level, "log level neither unset nor one of the known names");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string, std::less<>> env;
  Config explicit_values;
  size_t begin = 0;
  while (begin < input.size()) {
    size_t end = input.find('\n', begin);
    if (end == std::string_view::npos) end = input.size();
    const std::string_view line = input.substr(begin, end - begin);
    begin = end + 1;
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, eq);
    const std::string_view value = line.substr(eq + 1);
    if (name.starts_with("config.")) {
      set_field(&explicit_values, name.substr(7), value);
    } else {
      env[std::string(variable_for(name))] = std::string(value);
    }
  }
  const taiji::EnvLookup lookup = [&env](const char* name) -> const char* {
    const auto it = env.find(std::string_view(name));
    return it == env.end() ? nullptr : it->second.c_str();
  };

  auto resolved = taiji::resolve_config(explicit_values, lookup);
  if (!resolved.is_ok()) {
    check(resolved.status().code() == taiji::Code::Config && !resolved.status().message().empty(),
          "a rejection is not a Config error with a message");
    return 0;
  }
  check_resolved(resolved.value());

  const taiji::EnvLookup empty = [](const char*) -> const char* { return nullptr; };
  auto again = taiji::resolve_config(resolved.value(), empty);
  check(again.is_ok(), "a resolved configuration is rejected when resolved again");
  check(same(resolved.value(), again.value()), "resolving a resolved configuration changed it");
  return 0;
}
