#include "runtime/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "common/time_limit.h"
#include "monitor/http_server.h"
#include "bootstrap/rendezvous.h"
#include "topology/strategies.h"
#include "topology/text.h"

namespace taiji {

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

constexpr int64_t kDefaultTimeoutMs = 60000;
constexpr uint64_t kDefaultChunkBytes = 1 * kMiB;
constexpr uint64_t kDefaultEagerBytes = 64 * kKiB;
constexpr uint64_t kDefaultFusionMaxOpBytes = 64 * kKiB;
constexpr uint64_t kDefaultFusionBufferBytes = 4 * kKiB * kKiB;
constexpr uint64_t kDefaultUnexpectedBytes = 64 * kMiB;
constexpr uint64_t kDefaultMaxPayload = 64 * kMiB;
// libuv takes each buffer's length as 32 bits; a larger payload would be cut on the wire.
constexpr uint64_t kMaxPayloadLimit = 4 * kMiB * kKiB - 1;
constexpr uint32_t kDefaultMaxNameLen = 256;
constexpr int64_t kDefaultHandshakeTimeoutMs = 10000;
constexpr int64_t kDefaultMaxPending = 64;
constexpr size_t kMaxJobIdBytes = kRendezvousMaxKey - 32;  // room for "/addr/" and a rank
constexpr size_t kMaxHostLabelBytes = 4096;
constexpr int64_t kMaxPending = 65536;  // more than any host's file descriptors allow
constexpr int64_t kDefaultStallWarnMs = 10000;
constexpr int64_t kDefaultFlightRecorderSize = 256;
constexpr int64_t kMaxFlightRecorderSize = 1 << 20;
// Long enough to cover a small op's round trip on loopback or a fast LAN, short enough
// that an idle peer gives its core back within a fraction of a millisecond.
constexpr int64_t kDefaultSpinUs = 200;
constexpr int64_t kMaxSpinUs = 1000000;
constexpr size_t kMinSecretBytes = 16;
constexpr size_t kMaxSecretBytes = 4096;
// Below this the per-frame header and syscall overhead dominate the transfer.
constexpr uint64_t kMinChunkBytes = 4 * kKiB;
// The frame header carries name_len in 16 bits.
constexpr uint32_t kMaxNameLenCap = 65535;
// The library's own ops ("taiji.set_topology", 18 bytes) and a statistics-carrying name's
// suffix must fit under the cap on every peer, or swaps and statistics fail for names the
// caller never chose.
constexpr uint32_t kMinNameLen = 32;

constexpr std::array<std::string_view, 2> kProgressModes = {"adaptive", "blocking"};
// Rings hold this many chunks by default: enough that a sender seldom waits for room (each
// wait costs a credit frame and a wake-up), few enough that the ring stays in cache. In
// alternating runs at n=2 and 4, 1-64 MiB, 4 MiB rings were never far from the best of
// 2, 4 and 8 MiB; 8 MiB was 1.1-1.6x slower from 16 MiB, 2 MiB up to 1.6x slower at 4 MiB
// on a loaded host.
constexpr uint64_t kShmRingChunks = 4;
constexpr uint64_t kMinShmRingBytes = 64 * kKiB;
constexpr uint64_t kMaxShmRingBytes = 16 * kMiB * kKiB;
constexpr std::array<std::string_view, 2> kShmModes = {"auto", "off"};

constexpr std::array<std::string_view, 7> kLogLevels = {"trace", "debug",    "info", "warn",
                                                        "error", "critical", "off"};

Status config_error(std::string message) { return {Code::Config, std::move(message)}; }

// An empty value counts as unset, so `export TAIJI_X=` clears a variable the same way
// `unset TAIJI_X` does.
const char* lookup(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

std::string named(const char* var, std::string_view value) {
  return std::string(var) + "='" + std::string(value) + "'";
}

// The whole string must be decimal digits and the value at most `max`.
bool parse_digits(std::string_view s, uint64_t max, uint64_t* out) {
  if (s.empty()) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (max - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

std::string join(const auto& names) {
  std::string s;
  for (std::string_view n : names) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

// A setting named by one of `names`; `what` and `source` say which setting in the error.
template <size_t N>
Status check_one_of(const char* what, const std::string& value, const std::string& source,
                    const std::array<std::string_view, N>& names) {
  for (std::string_view n : names) {
    if (value == n) return Status::ok();
  }
  return config_error(std::string(what) + " " + source + " is not one of " + join(names));
}

// Integer variables: `min` is 0 or 1 and picks the wording of the error.
Status env_int(const char* var, const char* value, uint64_t min, uint64_t max, uint64_t* out) {
  uint64_t v = 0;
  const char* what = min == 0 ? "a non-negative integer" : "a positive integer";
  if (!parse_digits(value, std::numeric_limits<uint64_t>::max(), &v)) {
    bool digits_only = *value != '\0';
    for (const char* p = value; *p; ++p) digits_only = digits_only && *p >= '0' && *p <= '9';
    if (digits_only) {
      return config_error(named(var, value) + " is out of range (at most " +
                          std::to_string(max) + ")");
    }
    return config_error(named(var, value) + " is not " + what);
  }
  if (v < min) return config_error(named(var, value) + " is not " + what);
  if (v > max) {
    return config_error(named(var, value) + " is out of range (at most " +
                        std::to_string(max) + ")");
  }
  *out = v;
  return Status::ok();
}

// Byte sizes: digits with an optional K, M or G suffix (powers of 1024); must be positive.
Status env_bytes(const char* var, const char* value, uint64_t* out) {
  std::string_view s(value);
  uint64_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K': case 'k': mult = kKiB; break;
      case 'M': case 'm': mult = kMiB; break;
      case 'G': case 'g': mult = 1024 * kMiB; break;
      default: break;
    }
    if (mult != 1) s.remove_suffix(1);
  }
  uint64_t v = 0;
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  if (!parse_digits(s, max, &v)) {
    bool digits_only = !s.empty();
    for (char c : s) digits_only = digits_only && c >= '0' && c <= '9';
    if (digits_only) return config_error(named(var, value) + " is out of range");
    return config_error(named(var, value) +
                        " is not a byte size (digits with an optional K, M or G suffix)");
  }
  if (v == 0) return config_error(named(var, value) + " is not a positive byte size");
  if (v > max / mult) return config_error(named(var, value) + " is out of range");
  *out = v * mult;
  return Status::ok();
}

// Where a resolved value came from, for error messages.
template <typename T>
std::string explicit_source(const char* field, const T& v) {
  return std::string(field) + "=" + std::to_string(v);
}

// A word a switch variable accepts and the setting it stands for.
struct SwitchWord {
  std::string_view text;
  int value;
};
constexpr std::array<SwitchWord, 2> kDigitWords = {{{"0", 0}, {"1", 1}}};
constexpr std::array<SwitchWord, 4> kOnOffWords = {{{"on", 1}, {"off", 0}, {"1", 1}, {"0", 0}}};

// A 0/1 setting that is -1 while unset (`unset` says what -1 means): unset, `var` sets it
// with one of `words`, and without the variable it is `fallback`.
template <size_t N>
Status resolve_switch(int* field, const char* name, const char* unset, const char* var,
                      const std::array<SwitchWord, N>& words, int fallback, const EnvLookup& env) {
  if (*field != -1 && *field != 0 && *field != 1) {
    return config_error(explicit_source(name, *field) + " must be 0, 1 or -1 (" + unset + ")");
  }
  if (*field != -1) return Status::ok();
  *field = fallback;
  const char* v = lookup(env, var);
  if (v == nullptr) return Status::ok();
  std::string allowed;
  for (size_t i = 0; i < N; ++i) {
    if (words[i].text == v) {
      *field = words[i].value;
      return Status::ok();
    }
    allowed += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(words[i].text);
  }
  return config_error(named(var, v) + " must be " + allowed);
}

// Fills a count that is -1 while unset: explicit value (checked against 0..max), else
// the variable, else the default.
Status fill_count(int64_t* field, const char* name, const char* var, int64_t def, int64_t max,
                  const EnvLookup& env) {
  if (*field < -1 || *field > max) {
    return config_error(explicit_source(name, *field) + " is not in 0.." + std::to_string(max));
  }
  if (*field != -1) return Status::ok();
  *field = def;
  if (const char* v = lookup(env, var)) {
    uint64_t n = 0;
    if (Status s = env_int(var, v, 0, static_cast<uint64_t>(max), &n); !s.is_ok()) return s;
    *field = static_cast<int64_t>(n);
  }
  return Status::ok();
}

// Fills a byte-size field: explicit (non-zero) value, else the variable, else the default.
Status fill_bytes(uint64_t* field, const char* name, const char* var, uint64_t def,
                  const EnvLookup& env, std::string* source) {
  if (*field != 0) {
    *source = explicit_source(name, *field);
    return Status::ok();
  }
  if (const char* v = lookup(env, var)) {
    *source = named(var, v);
    return env_bytes(var, v, field);
  }
  *field = def;
  *source = std::to_string(def) + " (default " + name + ")";
  return Status::ok();
}

Status fill_timeout(int64_t* field, const char* name, const char* var, const EnvLookup& env,
                    int64_t def = kDefaultTimeoutMs) {
  if (*field < 0) {
    return config_error(explicit_source(name, *field) + " is not a positive timeout");
  }
  // Longer than kMaxTimeoutMs counts as that long: in effect no limit.
  if (*field > 0) {
    *field = clamp_timeout_ms(*field);
    return Status::ok();
  }
  if (const char* v = lookup(env, var)) {
    uint64_t ms = 0;
    Status s = env_int(var, v, 1, static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), &ms);
    if (!s.is_ok()) return s;
    *field = static_cast<int64_t>(std::min<uint64_t>(ms, kMaxTimeoutMs));
    return Status::ok();
  }
  *field = def;
  return Status::ok();
}

void fill_string(std::string* field, const char* var, const char* def, const EnvLookup& env,
                 std::string* source) {
  if (!field->empty()) {
    *source = "'" + *field + "'";
    return;
  }
  if (const char* v = lookup(env, var)) {
    *field = v;
    *source = named(var, v);
    return;
  }
  *field = def;
  *source = "'" + *field + "'";
}

struct RankFamily {
  const char* rank;
  const char* size;
};
constexpr RankFamily kRankFamilies[] = {
    {"TAIJI_RANK", "TAIJI_WORLD_SIZE"},
    {"RANK", "WORLD_SIZE"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"SLURM_PROCID", "SLURM_NTASKS"},
};

Status resolve_rank_size(Config* c, const EnvLookup& env, std::string* rank_src,
                         std::string* size_src) {
  if (c->rank < -1) return config_error(explicit_source("rank", c->rank) + " is negative");
  if (c->size == 0 || c->size < -1) {
    return config_error(explicit_source("size", c->size) + " is not a positive world size");
  }
  if (c->rank != -1) *rank_src = explicit_source("rank", c->rank);
  if (c->size != -1) *size_src = explicit_source("size", c->size);

  if (c->rank == -1 || c->size == -1) {
    for (const RankFamily& f : kRankFamilies) {
      const char* r = lookup(env, f.rank);
      const char* s = lookup(env, f.size);
      if (r == nullptr && s == nullptr) continue;
      if (r == nullptr || s == nullptr) {
        // Foreign launchers may set one of the pair for their own reasons (salloc sets
        // SLURM_NTASKS without SLURM_PROCID); only our own variables must come together.
        if (&f != &kRankFamilies[0]) continue;
        const char* set = r ? f.rank : f.size;
        const char* unset = r ? f.size : f.rank;
        return config_error(named(set, r ? r : s) + " is set but " + unset + " is not");
      }
      const uint64_t int_max = static_cast<uint64_t>(std::numeric_limits<int>::max());
      uint64_t rv = 0;
      uint64_t sv = 0;
      if (Status st = env_int(f.rank, r, 0, int_max, &rv); !st.is_ok()) return st;
      if (Status st = env_int(f.size, s, 1, int_max, &sv); !st.is_ok()) return st;
      if (c->rank == -1) {
        c->rank = static_cast<int>(rv);
        *rank_src = named(f.rank, r);
      }
      if (c->size == -1) {
        c->size = static_cast<int>(sv);
        *size_src = named(f.size, s);
      }
      break;
    }
  }

  if (c->rank == -1 && c->size == -1) {
    c->rank = 0;
    c->size = 1;
    return Status::ok();
  }
  if (c->rank == -1) {
    if (c->size != 1) {
      return config_error(*size_src + " is set but no rank is (set TAIJI_RANK or the rank field)");
    }
    c->rank = 0;
    return Status::ok();
  }
  if (c->size == -1) {
    return config_error(*rank_src +
                        " is set but no world size is (set TAIJI_WORLD_SIZE or the size field)");
  }
  if (c->rank >= c->size) {
    return config_error(*rank_src + " is not below the world size " + *size_src);
  }
  return Status::ok();
}

Status resolve_rendezvous(Config* c, const EnvLookup& env, const std::string& size_src) {
  std::string source;
  if (!c->rendezvous.empty()) {
    source = "rendezvous='" + c->rendezvous + "'";
  } else if (const char* v = lookup(env, "TAIJI_RENDEZVOUS")) {
    c->rendezvous = v;
    source = named("TAIJI_RENDEZVOUS", v);
  } else if (const char* addr = lookup(env, "MASTER_ADDR")) {
    uint64_t port = 0;
    if (const char* p = lookup(env, "TAIJI_RENDEZVOUS_PORT")) {
      if (Status s = env_int("TAIJI_RENDEZVOUS_PORT", p, 1, 65535, &port); !s.is_ok()) return s;
      source = named("MASTER_ADDR", addr) + " with " + named("TAIJI_RENDEZVOUS_PORT", p);
    } else if (const char* mp = lookup(env, "MASTER_PORT")) {
      if (Status s = env_int("MASTER_PORT", mp, 1, 65535, &port); !s.is_ok()) return s;
      // torchrun's own store listens on MASTER_PORT, so taiji's takes the next port.
      if (port == 65535) {
        return config_error(named("MASTER_PORT", mp) +
                            " leaves no port for the rendezvous (it uses MASTER_PORT + 1); "
                            "set TAIJI_RENDEZVOUS_PORT");
      }
      ++port;
      source = named("MASTER_ADDR", addr) + " with " + named("MASTER_PORT", mp) + " + 1";
    } else if (c->size > 1) {
      return config_error(named("MASTER_ADDR", addr) +
                          " is set but neither MASTER_PORT nor TAIJI_RENDEZVOUS_PORT is");
    }
    if (port != 0) {
      std::string host = addr;
      if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
      c->rendezvous = host + ":" + std::to_string(port);
    }
  }

  if (!c->rendezvous.empty()) {
    std::string host;
    uint16_t port = 0;
    if (std::string why = split_host_port(c->rendezvous, false, &host, &port); !why.empty()) {
      return config_error(source + " is not host:port: " + why);
    }
  } else if (c->size > 1) {
    return config_error("world size " + size_src +
                        " needs a rendezvous address: set TAIJI_RENDEZVOUS (host:port) or "
                        "MASTER_ADDR and MASTER_PORT");
  }

  return resolve_switch(&c->host_rendezvous, "host_rendezvous", "auto", "TAIJI_RENDEZVOUS_HOST",
                        kDigitWords, c->rank == 0 ? 1 : 0, env);
}

// Fusion of small allreduces: on or off, and its two sizes.
Status resolve_fusion(Config* c, const EnvLookup& env) {
  if (Status s = resolve_switch(&c->fusion, "fusion", "unset", "TAIJI_FUSION", kOnOffWords, 0, env);
      !s.is_ok()) {
    return s;
  }
  std::string op_src;
  std::string buffer_src;
  if (Status s = fill_bytes(&c->fusion_max_op_bytes, "fusion_max_op_bytes", "TAIJI_FUSION_MAX_OP_BYTES",
                            kDefaultFusionMaxOpBytes, env, &op_src);
      !s.is_ok()) {
    return s;
  }
  if (Status s = fill_bytes(&c->fusion_buffer_bytes, "fusion_buffer_bytes", "TAIJI_FUSION_BUFFER_BYTES",
                            kDefaultFusionBufferBytes, env, &buffer_src);
      !s.is_ok()) {
    return s;
  }
  if (c->fusion_max_op_bytes > c->fusion_buffer_bytes) {
    return config_error("fusion op size " + op_src + " exceeds the fusion buffer " + buffer_src);
  }
  return Status::ok();
}

// Metrics on or off, the Prometheus endpoint, and the flight recorder.
Status resolve_monitoring(Config* c, const EnvLookup& env) {
  if (Status s = resolve_switch(&c->metrics, "metrics", "unset", "TAIJI_METRICS", kDigitWords, 1, env);
      !s.is_ok()) {
    return s;
  }
  std::string source;
  fill_string(&c->metrics_addr, "TAIJI_METRICS_ADDR", "", env, &source);
  if (!c->metrics_addr.empty()) {
    std::string host;
    uint16_t port = 0;
    if (std::string why = parse_metrics_address(c->metrics_addr, &host, &port); !why.empty()) {
      return config_error("metrics address " + source + " is not [host:]port: " + why);
    }
  }
  if (Status s = fill_count(&c->flight_recorder_size, "flight_recorder_size",
                            "TAIJI_FLIGHT_RECORDER_SIZE", kDefaultFlightRecorderSize,
                            kMaxFlightRecorderSize, env);
      !s.is_ok()) {
    return s;
  }
  const char* tmp = lookup(env, "TMPDIR");
  fill_string(&c->flight_recorder_dir, "TAIJI_FLIGHT_RECORDER_DIR", tmp != nullptr ? tmp : "/tmp",
              env, &source);
  return Status::ok();
}

// How waiting threads wait: the mode and the spin window.
Status resolve_progress(Config* c, const EnvLookup& env) {
  std::string source;
  fill_string(&c->progress, "TAIJI_PROGRESS", "adaptive", env, &source);
  if (Status s = check_one_of("progress mode", c->progress, source, kProgressModes); !s.is_ok()) return s;
  return fill_count(&c->spin_us, "spin_us", "TAIJI_SPIN_US", kDefaultSpinUs, kMaxSpinUs, env);
}

}  // namespace

EnvLookup process_env() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

Result<Config> resolve_config(Config c, const EnvLookup& env) {
  std::string rank_src;
  std::string size_src;
  if (Status s = resolve_rank_size(&c, env, &rank_src, &size_src); !s.is_ok()) return s;
  if (Status s = resolve_rendezvous(&c, env, size_src); !s.is_ok()) return s;

  std::string listen_src;
  std::string job_src;
  std::string topo_src;
  std::string level_src;
  fill_string(&c.listen_host, "TAIJI_LISTEN_HOST", "127.0.0.1", env, &listen_src);
  fill_string(&c.job_id, "TAIJI_JOB_ID", "taiji", env, &job_src);
  fill_string(&c.topology, "TAIJI_TOPOLOGY", "", env, &topo_src);
  std::string host_src;
  fill_string(&c.host_label, "TAIJI_HOST", "", env, &host_src);
  if (c.host_label.empty()) c.host_label = c.listen_host;
  fill_string(&c.log_level, "TAIJI_LOG_LEVEL", "warn", env, &level_src);
  std::string shm_src;
  fill_string(&c.shm, "TAIJI_SHM", "auto", env, &shm_src);
  std::string cc_src;
  fill_string(&c.tcp_congestion, "TAIJI_TCP_CONGESTION", "", env, &cc_src);

  if (Status s = fill_timeout(&c.timeout_ms, "timeout_ms", "TAIJI_TIMEOUT_MS", env); !s.is_ok()) {
    return s;
  }
  if (Status s = fill_timeout(&c.init_timeout_ms, "init_timeout_ms", "TAIJI_INIT_TIMEOUT_MS", env);
      !s.is_ok()) {
    return s;
  }

  if (Status s = fill_timeout(&c.handshake_timeout_ms, "handshake_timeout_ms",
                              "TAIJI_HANDSHAKE_TIMEOUT_MS", env, kDefaultHandshakeTimeoutMs);
      !s.is_ok()) {
    return s;
  }
  if (c.max_pending_connections < 0 || c.max_pending_connections > kMaxPending) {
    return config_error(explicit_source("max_pending_connections", c.max_pending_connections) +
                        " is not in 1.." + std::to_string(kMaxPending));
  }
  if (c.max_pending_connections == 0) {
    c.max_pending_connections = kDefaultMaxPending;
    if (const char* v = lookup(env, "TAIJI_MAX_PENDING_CONNECTIONS")) {
      uint64_t n = 0;
      Status s = env_int("TAIJI_MAX_PENDING_CONNECTIONS", v, 1, static_cast<uint64_t>(kMaxPending), &n);
      if (!s.is_ok()) return s;
      c.max_pending_connections = static_cast<int64_t>(n);
    }
  }
  if (c.stall_warn_ms < -1) {
    return config_error(explicit_source("stall_warn_ms", c.stall_warn_ms) + " is negative");
  }
  if (c.stall_warn_ms == -1) {
    c.stall_warn_ms = kDefaultStallWarnMs;
    if (const char* v = lookup(env, "TAIJI_STALL_WARN_MS")) {
      uint64_t ms = 0;
      Status s = env_int("TAIJI_STALL_WARN_MS", v, 0,
                         static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), &ms);
      if (!s.is_ok()) return s;
      c.stall_warn_ms = static_cast<int64_t>(ms);
    }
  }
  if (Status s = resolve_monitoring(&c, env); !s.is_ok()) return s;
  if (Status s = resolve_progress(&c, env); !s.is_ok()) return s;
  if (Status s = resolve_fusion(&c, env); !s.is_ok()) return s;
  std::string secret_src;
  fill_string(&c.secret_file, "TAIJI_SECRET_FILE", "", env, &secret_src);
  if (!c.secret_file.empty()) {
    auto secret = read_secret_file(c.secret_file);
    if (!secret.is_ok()) return secret.status();
    c.secret = std::move(secret.value());
  }

  std::string chunk_src;
  std::string eager_src;
  std::string unexpected_src;
  std::string payload_src;
  if (Status s = fill_bytes(&c.chunk_bytes, "chunk_bytes", "TAIJI_CHUNK_BYTES",
                            kDefaultChunkBytes, env, &chunk_src);
      !s.is_ok()) {
    return s;
  }
  if (Status s = fill_bytes(&c.eager_bytes, "eager_bytes", "TAIJI_EAGER_BYTES",
                            kDefaultEagerBytes, env, &eager_src);
      !s.is_ok()) {
    return s;
  }
  if (Status s = fill_bytes(&c.unexpected_bytes, "unexpected_bytes", "TAIJI_UNEXPECTED_BYTES",
                            kDefaultUnexpectedBytes, env, &unexpected_src);
      !s.is_ok()) {
    return s;
  }
  if (Status s = fill_bytes(&c.max_payload, "max_payload", "TAIJI_MAX_PAYLOAD_BYTES",
                            kDefaultMaxPayload, env, &payload_src);
      !s.is_ok()) {
    return s;
  }

  std::string ring_src;
  const uint64_t default_ring =
      c.chunk_bytes > kMaxShmRingBytes / kShmRingChunks
          ? kMaxShmRingBytes
          : std::max(kMinShmRingBytes, kShmRingChunks * c.chunk_bytes);
  if (Status s = fill_bytes(&c.shm_ring_bytes, "shm_ring_bytes", "TAIJI_SHM_RING_BYTES",
                            default_ring, env, &ring_src);
      !s.is_ok()) {
    return s;
  }
  if (Status s = check_one_of("shared-memory mode", c.shm, shm_src, kShmModes); !s.is_ok()) return s;
  // The kernel's names (TCP_CA_NAME_MAX); whether this host has it is checked at init.
  const bool cc_ok = c.tcp_congestion.size() < 16 &&
                     std::all_of(c.tcp_congestion.begin(), c.tcp_congestion.end(), [](char ch) {
                       return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_';
                     });
  if (!cc_ok) {
    return config_error("TCP congestion control " + cc_src +
                        " is not a name like cubic or bbr (lower-case letters, digits, '_'; at most 15)");
  }
  if (c.shm_ring_bytes < kMinShmRingBytes || c.shm_ring_bytes > kMaxShmRingBytes) {
    return config_error("shared-memory ring size " + ring_src + " is not between " +
                        std::to_string(kMinShmRingBytes) + " and " +
                        std::to_string(kMaxShmRingBytes) + " bytes");
  }

  std::string name_len_src;
  if (c.max_name_len != 0) {
    name_len_src = explicit_source("max_name_len", c.max_name_len);
  } else if (const char* v = lookup(env, "TAIJI_MAX_NAME_LEN")) {
    uint64_t n = 0;
    if (Status s = env_int("TAIJI_MAX_NAME_LEN", v, 1, kMaxNameLenCap, &n); !s.is_ok()) return s;
    c.max_name_len = static_cast<uint32_t>(n);
    name_len_src = named("TAIJI_MAX_NAME_LEN", v);
  } else {
    c.max_name_len = kDefaultMaxNameLen;
    name_len_src = explicit_source("max_name_len", c.max_name_len) + " (default)";
  }

  if (c.max_name_len > kMaxNameLenCap) {
    return config_error(name_len_src + " exceeds " + std::to_string(kMaxNameLenCap) +
                        " (the frame header holds it in 16 bits)");
  }
  if (c.max_name_len < kMinNameLen) {
    return config_error(name_len_src + " is below " + std::to_string(kMinNameLen) +
                        " (the library's own op names need up to 18 bytes)");
  }
  // The job id travels as the name of the Hello frame.
  if (c.job_id.size() > c.max_name_len) {
    return config_error("job id " + job_src + " is longer than max_name_len " + name_len_src);
  }
  // Each peer publishes "<address>\n<host label>" under "<job id>/addr/<rank>" in the
  // rendezvous store, whose keys and values are bounded.
  if (c.job_id.size() > kMaxJobIdBytes) {
    return config_error("job id " + job_src.substr(0, 80) + "... is longer than " +
                        std::to_string(kMaxJobIdBytes) + " bytes (the rendezvous key holds it)");
  }
  if (c.host_label.size() > kMaxHostLabelBytes) {
    return config_error("host label " + host_src.substr(0, 80) + "... is longer than " +
                        std::to_string(kMaxHostLabelBytes) + " bytes");
  }
  if (!c.topology.empty()) {
    // Host-aware shapes are rebuilt once the hosts are known; this checks the text.
    // A built-in name is only checked: building it for a large world costs n^2. (With the
    // whitespace the text grammar allows around it, too.)
    const auto& names = strategy_names();
    if (std::find(names.begin(), names.end(), topology_text_body(c.topology)) == names.end()) {
      auto parsed = parse_topology(c.topology, c.size, {});
      if (!parsed.is_ok()) return config_error("topology " + topo_src + ": " + parsed.status().message());
    }
  }
  if (Status s = check_one_of("log level", c.log_level, level_src, kLogLevels); !s.is_ok()) return s;
  if (c.chunk_bytes < kMinChunkBytes) {
    return config_error("chunk size " + chunk_src + " is below the minimum " +
                        std::to_string(kMinChunkBytes) + " bytes");
  }
  if (c.max_payload > kMaxPayloadLimit) {
    return config_error("max payload " + payload_src + " exceeds " +
                        std::to_string(kMaxPayloadLimit) +
                        " bytes (4 GiB - 1, the largest socket buffer libuv takes)");
  }
  if (c.chunk_bytes > c.max_payload) {
    return config_error("chunk size " + chunk_src + " exceeds the max payload " + payload_src);
  }
  if (c.eager_bytes > c.max_payload) {
    return config_error("eager size " + eager_src + " exceeds the max payload " + payload_src);
  }
  return c;
}

Result<std::string> read_secret_file(const std::string& path) {
  const std::string what = "secret file '" + path + "'";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return config_error("cannot open " + what + ": " + std::strerror(errno));
  struct stat st {};
  std::string bytes;
  Status s;
  if (fstat(fd, &st) != 0) {
    s = config_error("cannot stat " + what + ": " + std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    s = config_error(what + " is not a regular file");
  } else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    s = config_error(what + " has mode " + mode +
                     ": a job secret must not be readable by group or others (chmod 600)");
  } else if (st.st_size < static_cast<off_t>(kMinSecretBytes) ||
             st.st_size > static_cast<off_t>(kMaxSecretBytes)) {
    s = config_error(what + " holds " + std::to_string(st.st_size) + " bytes; a secret is " +
                     std::to_string(kMinSecretBytes) + " to " + std::to_string(kMaxSecretBytes));
  } else {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t have = 0;
    while (have < bytes.size()) {
      ssize_t n = read(fd, bytes.data() + have, bytes.size() - have);
      if (n <= 0) {
        s = config_error("cannot read " + what + ": " + (n < 0 ? std::strerror(errno) : "short"));
        break;
      }
      have += static_cast<size_t>(n);
    }
  }
  close(fd);
  if (!s.is_ok()) return s;
  return bytes;
}

}  // namespace taiji
