#include "runtime/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/settings.h"
#include "topology/strategies.h"
#include "topology/text.h"

namespace taiji {

namespace {

constexpr size_t kMinSecretBytes = 16;
constexpr size_t kMaxSecretBytes = 4096;
// The library's own ops ("taiji.set_topology", 18 bytes) and a statistics-carrying name's
// suffix must fit under the cap on every peer, or swaps and statistics fail for names the
// caller never chose.
constexpr uint32_t kMinNameLen = 32;

// An empty value counts as unset, so `export TAIJI_X=` clears a variable the same way
// `unset TAIJI_X` does.
const char* lookup(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

std::string explicit_source(const char* field, int64_t v) {
  return std::string(field) + "=" + std::to_string(v);
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
      if (Status st = parse_int(f.rank, r, 0, int_max, &rv); !st.is_ok()) return st;
      if (Status st = parse_int(f.size, s, 1, int_max, &sv); !st.is_ok()) return st;
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
    uint64_t port = static_cast<uint64_t>(c->rendezvous_port);
    if (port != 0) {
      source = named("MASTER_ADDR", addr) + " with " + explicit_source("rendezvous_port", c->rendezvous_port);
    } else if (const char* p = lookup(env, "TAIJI_RENDEZVOUS_PORT")) {
      if (Status s = parse_int("TAIJI_RENDEZVOUS_PORT", p, 1, 65535, &port); !s.is_ok()) return s;
      source = named("MASTER_ADDR", addr) + " with " + named("TAIJI_RENDEZVOUS_PORT", p);
    } else if (const char* mp = lookup(env, "MASTER_PORT")) {
      if (Status s = parse_int("MASTER_PORT", mp, 1, 65535, &port); !s.is_ok()) return s;
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
    if (std::string why = find_setting("TAIJI_RENDEZVOUS")->check(c->rendezvous); !why.empty()) {
      return config_error(source + " " + why);
    }
  } else if (c->size > 1) {
    return config_error("world size " + size_src +
                        " needs a rendezvous address: set TAIJI_RENDEZVOUS (host:port) or "
                        "MASTER_ADDR and MASTER_PORT");
  }
  return Status::ok();
}

// Where each setting's resolved value came from, as errors quote it.
class Sources {
 public:
  explicit Sources(size_t n) : text_(n) {}
  void set(const Setting& s, std::string text) { text_[index(s)] = std::move(text); }
  const std::string& of(std::string_view name) const { return text_[index(*find_setting(name))]; }

 private:
  static size_t index(const Setting& s) { return static_cast<size_t>(&s - settings().data()); }
  std::vector<std::string> text_;
};

// An explicit value is checked, a variable parsed, else the default filled in.
Status resolve_setting(const Setting& s, Config* c, const EnvLookup& env, Sources* sources) {
  if (is_set(s, *c)) {
    sources->set(s, value_source(s, *c));
    return check_resolved(s, c, value_source(s, *c));
  }
  const std::string name(s.name);
  if (const char* v = lookup(env, name.c_str())) {
    sources->set(s, named(s.name, v));
    return parse_setting(s, v, c);
  }
  const std::string def = s.computed_default ? s.computed_default(*c, env) : std::string(s.def);
  if (!def.empty()) {
    if (Status st = parse_setting(s, def, c); !st.is_ok()) return st;
  }
  std::string source = value_source(s, *c);
  if (s.type != SettingType::String && s.type != SettingType::Enum) source += " (default)";
  sources->set(s, std::move(source));
  return Status::ok();
}

// Rules between settings, which no single setting's parser can check.
Status check_across(Config& c, const Sources& src) {
  if (c.fusion_max_op_bytes > c.fusion_buffer_bytes) {
    return config_error("fusion op size " + src.of("TAIJI_FUSION_MAX_OP_BYTES") +
                        " exceeds the fusion buffer " + src.of("TAIJI_FUSION_BUFFER_BYTES"));
  }
  const std::string& name_len_src = src.of("TAIJI_MAX_NAME_LEN");
  if (c.max_name_len < kMinNameLen) {
    return config_error(name_len_src + " is below " + std::to_string(kMinNameLen) +
                        " (the library's own op names need up to 18 bytes)");
  }
  // The job id travels as the name of the Hello frame.
  if (c.job_id.size() > c.max_name_len) {
    return config_error("job id " + src.of("TAIJI_JOB_ID") + " is longer than max_name_len " +
                        name_len_src);
  }
  if (!c.topology.empty()) {
    // Host-aware shapes are rebuilt once the hosts are known; this checks the text.
    // A built-in name is only checked: building it for a large world costs n^2. (With the
    // whitespace the text grammar allows around it, too.)
    const auto& names = strategy_names();
    if (std::find(names.begin(), names.end(), topology_text_body(c.topology)) == names.end()) {
      auto parsed = parse_topology(c.topology, c.size, {});
      if (!parsed.is_ok()) {
        return config_error("topology " + src.of("TAIJI_TOPOLOGY") + ": " +
                            parsed.status().message());
      }
    }
  }
  const std::string& payload_src = src.of("TAIJI_MAX_PAYLOAD_BYTES");
  if (c.chunk_bytes > c.max_payload) {
    return config_error("chunk size " + src.of("TAIJI_CHUNK_BYTES") + " exceeds the max payload " +
                        payload_src);
  }
  if (c.eager_bytes > c.max_payload) {
    return config_error("eager size " + src.of("TAIJI_EAGER_BYTES") + " exceeds the max payload " +
                        payload_src);
  }
  if (c.link_probe_bytes > c.max_payload) {
    return config_error("link probe size " + src.of("TAIJI_LINK_PROBE_BYTES") + " exceeds the max payload " +
                        payload_src);
  }
  if (!c.secret_file.empty()) {
    auto secret = read_secret_file(c.secret_file);
    if (!secret.is_ok()) return secret.status();
    c.secret = std::move(secret.value());
  }
  return Status::ok();
}

}  // namespace

EnvLookup process_env() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

Result<Config> resolve_config(Config c, const EnvLookup& env) {
  // Explicit values of the settings resolved apart are checked first, as the generic pass
  // checks the others.
  for (const Setting& s : settings()) {
    if (!s.resolved_apart || s.type != SettingType::Integer) continue;
    if (Status st = check_resolved(s, &c, value_source(s, c)); !st.is_ok()) return st;
  }
  std::string rank_src;
  std::string size_src;
  if (Status s = resolve_rank_size(&c, env, &rank_src, &size_src); !s.is_ok()) return s;
  if (Status s = resolve_rendezvous(&c, env, size_src); !s.is_ok()) return s;
  Sources sources(settings().size());
  for (const Setting& s : settings()) {
    if (s.resolved_apart) continue;
    if (Status st = resolve_setting(s, &c, env, &sources); !st.is_ok()) return st;
  }
  if (Status s = check_across(c, sources); !s.is_ok()) return s;
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
