#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "runtime/config.h"

using namespace taiji;

namespace {

using Env = std::map<std::string, std::string>;

Result<Config> resolve(const Env& env, Config c = {}) {
  EnvLookup lookup = [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  return resolve_config(std::move(c), lookup);
}

Config ok(const Env& env, Config c = {}) {
  Result<Config> r = resolve(env, std::move(c));
  INFO(r.status().message());
  REQUIRE(r.is_ok());
  return r.value();
}

std::string error(const Env& env, Config c = {}) {
  Result<Config> r = resolve(env, std::move(c));
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == Code::Config);
  return r.status().message();
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

const Env kTaiji = {{"TAIJI_RANK", "1"}, {"TAIJI_WORLD_SIZE", "4"},
                    {"TAIJI_RENDEZVOUS", "10.1.1.1:7000"}};

}  // namespace

TEST_CASE("nothing set means a single peer with defaults", "[config]") {
  Config c = ok({});
  CHECK(c.rank == 0);
  CHECK(c.size == 1);
  CHECK(c.rendezvous.empty());
  CHECK(c.host_rendezvous == 1);
  CHECK(c.listen_host == "127.0.0.1");
  CHECK(c.job_id == "taiji");
  CHECK(c.timeout_ms == 60000);
  CHECK(c.init_timeout_ms == 60000);
  CHECK(c.chunk_bytes == 1024 * 1024);
  CHECK(c.eager_bytes == 64 * 1024);
  CHECK(c.unexpected_bytes == 64 * 1024 * 1024);
  CHECK(c.max_payload == 64 * 1024 * 1024);
  CHECK(c.max_name_len == 256);
  CHECK(c.topology.empty());
  CHECK(c.log_level.empty());  // the process's level is left as it is
}

TEST_CASE("rank and size come as a pair from the first family that sets them", "[config]") {
  const Env torch = {{"RANK", "2"}, {"WORLD_SIZE", "5"}};
  const Env ompi = {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "6"}};
  const Env slurm = {{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "7"}};
  const Env rdv = {{"TAIJI_RENDEZVOUS", "h:1"}};
  auto merge = [](std::vector<Env> parts) {
    Env e;
    for (const Env& p : parts) e.insert(p.begin(), p.end());
    return e;
  };

  Config c = ok(merge({kTaiji, torch, ompi, slurm}));
  CHECK(c.rank == 1);
  CHECK(c.size == 4);
  c = ok(merge({torch, ompi, slurm, rdv}));
  CHECK((c.rank == 2 && c.size == 5));
  c = ok(merge({ompi, slurm, rdv}));
  CHECK((c.rank == 3 && c.size == 6));
  c = ok(merge({slurm, rdv}));
  CHECK((c.rank == 4 && c.size == 7));

  // Never mixed across families: a half-set foreign family is passed over.
  c = ok(merge({{{"RANK", "9"}}, ompi, rdv}));
  CHECK((c.rank == 3 && c.size == 6));
  c = ok(merge({{{"OMPI_COMM_WORLD_SIZE", "9"}}, slurm, rdv}));
  CHECK((c.rank == 4 && c.size == 7));
  // salloc sets SLURM_NTASKS alone; a lone process there is still rank 0 of 1.
  c = ok({{"SLURM_NTASKS", "8"}});
  CHECK((c.rank == 0 && c.size == 1));

  // Half of taiji's own pair is a mistake, not something to skip.
  std::string m = error(merge({{{"TAIJI_RANK", "1"}}, torch}));
  CHECK(contains(m, "TAIJI_RANK='1' is set but TAIJI_WORLD_SIZE is not"));
  m = error({{"TAIJI_WORLD_SIZE", "3"}});
  CHECK(contains(m, "TAIJI_WORLD_SIZE='3' is set but TAIJI_RANK is not"));

  // An empty value counts as unset.
  c = ok(merge({{{"TAIJI_RANK", ""}, {"TAIJI_WORLD_SIZE", ""}}, torch, rdv}));
  CHECK((c.rank == 2 && c.size == 5));
}

TEST_CASE("explicit values win over the environment", "[config]") {
  Env env = kTaiji;
  env.insert({{"TAIJI_LISTEN_HOST", "10.0.0.9"},
              {"TAIJI_JOB_ID", "envjob"},
              {"TAIJI_TIMEOUT_MS", "5"},
              {"TAIJI_INIT_TIMEOUT_MS", "6"},
              {"TAIJI_CHUNK_BYTES", "8K"},
              {"TAIJI_EAGER_BYTES", "1K"},
              {"TAIJI_UNEXPECTED_BYTES", "2M"},
              {"TAIJI_MAX_PAYLOAD_BYTES", "4M"},
              {"TAIJI_MAX_NAME_LEN", "64"},
              {"TAIJI_TOPOLOGY", "star"},
              {"TAIJI_LOG_LEVEL", "debug"},
              {"TAIJI_RENDEZVOUS_HOST", "1"}});

  Config from_env = ok(env);
  CHECK(from_env.rank == 1);
  CHECK(from_env.size == 4);
  CHECK(from_env.rendezvous == "10.1.1.1:7000");
  CHECK(from_env.host_rendezvous == 1);
  CHECK(from_env.listen_host == "10.0.0.9");
  CHECK(from_env.job_id == "envjob");
  CHECK(from_env.timeout_ms == 5);
  CHECK(from_env.init_timeout_ms == 6);
  CHECK(from_env.chunk_bytes == 8 * 1024);
  CHECK(from_env.eager_bytes == 1024);
  CHECK(from_env.unexpected_bytes == 2 * 1024 * 1024);
  CHECK(from_env.max_payload == 4 * 1024 * 1024);
  CHECK(from_env.max_name_len == 64);
  CHECK(from_env.topology == "star");
  CHECK(from_env.log_level == "debug");

  Config x;
  x.rank = 2;
  x.size = 3;
  x.rendezvous = "[::1]:9000";
  x.host_rendezvous = 0;
  x.listen_host = "0.0.0.0";
  x.job_id = "mine";
  x.timeout_ms = 100;
  x.init_timeout_ms = 200;
  x.chunk_bytes = 16384;
  x.eager_bytes = 100;
  x.unexpected_bytes = 300;
  x.max_payload = 1 << 20;
  x.max_name_len = 32;
  x.topology = "ring";
  x.log_level = "off";
  Config c = ok(env, x);
  CHECK(c.rank == 2);
  CHECK(c.size == 3);
  CHECK(c.rendezvous == "[::1]:9000");
  CHECK(c.host_rendezvous == 0);
  CHECK(c.listen_host == "0.0.0.0");
  CHECK(c.job_id == "mine");
  CHECK(c.timeout_ms == 100);
  CHECK(c.init_timeout_ms == 200);
  CHECK(c.chunk_bytes == 16384);
  CHECK(c.eager_bytes == 100);
  CHECK(c.unexpected_bytes == 300);
  CHECK(c.max_payload == 1 << 20);
  CHECK(c.max_name_len == 32);
  CHECK(c.topology == "ring");
  CHECK(c.log_level == "off");

  // One explicit field; the other of the pair still comes from the environment.
  Config only_size;
  only_size.size = 8;
  c = ok(kTaiji, only_size);
  CHECK((c.rank == 1 && c.size == 8));
  Config only_rank;
  only_rank.rank = 3;
  c = ok(kTaiji, only_rank);
  CHECK((c.rank == 3 && c.size == 4));
  // An explicit rank and size need nothing from the environment, not even a valid pair.
  Config both;
  both.rank = 0;
  both.size = 1;
  c = ok({{"TAIJI_RANK", "x"}}, both);
  CHECK((c.rank == 0 && c.size == 1));
  // Explicit size 1 without a rank is rank 0.
  Config one;
  one.size = 1;
  CHECK(ok({}, one).rank == 0);
}

TEST_CASE("torchrun rendezvous is on MASTER_PORT + 1 unless TAIJI_RENDEZVOUS_PORT", "[config]") {
  Env torch = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node7"},
               {"MASTER_PORT", "29500"}};
  Config c = ok(torch);
  CHECK(c.rendezvous == "node7:29501");
  CHECK(c.host_rendezvous == 0);
  torch["RANK"] = "0";
  c = ok(torch);
  CHECK(c.host_rendezvous == 1);

  Env with_port = torch;
  with_port["TAIJI_RENDEZVOUS_PORT"] = "40000";
  CHECK(ok(with_port).rendezvous == "node7:40000");
  with_port.erase("MASTER_PORT");
  CHECK(ok(with_port).rendezvous == "node7:40000");

  Env explicit_rdv = torch;
  explicit_rdv["TAIJI_RENDEZVOUS"] = "other:5";
  CHECK(ok(explicit_rdv).rendezvous == "other:5");
  Config x;
  x.rendezvous = "mine:6";
  CHECK(ok(explicit_rdv, x).rendezvous == "mine:6");

  Env v6 = torch;
  v6["MASTER_ADDR"] = "fd00::7";
  CHECK(ok(v6).rendezvous == "[fd00::7]:29501");

  // MASTER_ADDR also serves other launchers' rank variables.
  Env slurm = {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"MASTER_ADDR", "n1"},
               {"MASTER_PORT", "100"}};
  CHECK(ok(slurm).rendezvous == "n1:101");

  Env top = torch;
  top["MASTER_PORT"] = "65535";
  std::string m = error(top);
  CHECK(contains(m, "MASTER_PORT='65535'"));
  CHECK(contains(m, "TAIJI_RENDEZVOUS_PORT"));

  Env no_port = torch;
  no_port.erase("MASTER_PORT");
  m = error(no_port);
  CHECK(contains(m, "MASTER_ADDR='node7'"));
  CHECK(contains(m, "MASTER_PORT"));
  // A lone peer needs no rendezvous at all.
  CHECK(ok({{"MASTER_ADDR", "node7"}}).rendezvous.empty());
}

TEST_CASE("host_rendezvous resolution", "[config]") {
  Env env = kTaiji;
  CHECK(ok(env).host_rendezvous == 0);
  env["TAIJI_RANK"] = "0";
  CHECK(ok(env).host_rendezvous == 1);
  env["TAIJI_RENDEZVOUS_HOST"] = "0";  // taiji-run serves it
  CHECK(ok(env).host_rendezvous == 0);
  env["TAIJI_RANK"] = "2";
  env["TAIJI_RENDEZVOUS_HOST"] = "1";
  CHECK(ok(env).host_rendezvous == 1);
  Config x;
  x.host_rendezvous = 0;
  CHECK(ok(env, x).host_rendezvous == 0);

  env["TAIJI_RENDEZVOUS_HOST"] = "yes";
  CHECK(contains(error(env), "TAIJI_RENDEZVOUS_HOST='yes'"));
  x.host_rendezvous = 2;
  CHECK(contains(error({}, x), "host_rendezvous=2"));
}

TEST_CASE("byte sizes accept K, M and G suffixes", "[config]") {
  auto chunk = [](const std::string& v) {
    return ok({{"TAIJI_CHUNK_BYTES", v}, {"TAIJI_MAX_PAYLOAD_BYTES", "3G"}}).chunk_bytes;
  };
  CHECK(chunk("4096") == 4096);
  CHECK(chunk("8K") == 8 * 1024);
  CHECK(chunk("8k") == 8 * 1024);
  CHECK(chunk("3M") == 3 * 1024 * 1024);
  CHECK(chunk("2G") == 2ull * 1024 * 1024 * 1024);
  CHECK(ok({{"TAIJI_MAX_PAYLOAD_BYTES", "1G"}}).max_payload == 1ull << 30);
  CHECK(ok({{"TAIJI_MAX_PAYLOAD_BYTES", "4294967295"}}).max_payload == 4294967295ull);
  CHECK(ok({{"TAIJI_UNEXPECTED_BYTES", "100"}}).unexpected_bytes == 100);
  CHECK(ok({{"TAIJI_EAGER_BYTES", "0001K"}}).eager_bytes == 1024);
}

TEST_CASE("every error names the variable and its value", "[config]") {
  struct Case {
    Env env;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {{{"TAIJI_RANK", "0"}, {"TAIJI_WORLD_SIZE", "abc"}},
       "TAIJI_WORLD_SIZE='abc' is not a positive integer"},
      {{{"TAIJI_RANK", "0"}, {"TAIJI_WORLD_SIZE", "0"}},
       "TAIJI_WORLD_SIZE='0' is not a positive integer"},
      {{{"TAIJI_RANK", "-1"}, {"TAIJI_WORLD_SIZE", "2"}},
       "TAIJI_RANK='-1' is not a non-negative integer"},
      {{{"TAIJI_RANK", " 1"}, {"TAIJI_WORLD_SIZE", "2"}}, "TAIJI_RANK=' 1'"},
      {{{"TAIJI_RANK", "1 "}, {"TAIJI_WORLD_SIZE", "2"}}, "TAIJI_RANK='1 '"},
      {{{"TAIJI_RANK", "+1"}, {"TAIJI_WORLD_SIZE", "2"}}, "TAIJI_RANK='+1'"},
      {{{"TAIJI_RANK", "0x1"}, {"TAIJI_WORLD_SIZE", "2"}}, "TAIJI_RANK='0x1'"},
      {{{"TAIJI_RANK", "0"}, {"TAIJI_WORLD_SIZE", "2147483648"}},
       "TAIJI_WORLD_SIZE='2147483648' is out of range"},
      {{{"TAIJI_RANK", "0"}, {"TAIJI_WORLD_SIZE", "99999999999999999999999"}},
       "TAIJI_WORLD_SIZE='99999999999999999999999' is out of range"},
      {{{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK='x'"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2k"}},
       "OMPI_COMM_WORLD_SIZE='2k'"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1.0"}}, "SLURM_NTASKS='1.0'"},
      {{{"TAIJI_RANK", "4"}, {"TAIJI_WORLD_SIZE", "4"}, {"TAIJI_RENDEZVOUS", "h:1"}},
       "TAIJI_RANK='4' is not below the world size TAIJI_WORLD_SIZE='4'"},
      {{{"TAIJI_RANK", "1"}, {"TAIJI_WORLD_SIZE", "2"}},
       "world size TAIJI_WORLD_SIZE='2' needs a rendezvous address: set TAIJI_RENDEZVOUS"},
      {{{"TAIJI_RANK", "1"}, {"TAIJI_WORLD_SIZE", "2"}, {"TAIJI_RENDEZVOUS", "nohost"}},
       "TAIJI_RENDEZVOUS='nohost' is not host:port"},
      {{{"TAIJI_RENDEZVOUS", "h:0"}}, "TAIJI_RENDEZVOUS='h:0'"},
      {{{"TAIJI_RENDEZVOUS", "h:65536"}}, "TAIJI_RENDEZVOUS='h:65536'"},
      {{{"MASTER_ADDR", "h"}, {"MASTER_PORT", "http"}}, "MASTER_PORT='http'"},
      {{{"MASTER_ADDR", "h"}, {"TAIJI_RENDEZVOUS_PORT", "70000"}},
       "TAIJI_RENDEZVOUS_PORT='70000'"},
      {{{"TAIJI_RENDEZVOUS_HOST", "2"}}, "TAIJI_RENDEZVOUS_HOST='2' must be 0 or 1"},
      {{{"TAIJI_TIMEOUT_MS", "0"}}, "TAIJI_TIMEOUT_MS='0' is not a positive integer"},
      {{{"TAIJI_TIMEOUT_MS", "10s"}}, "TAIJI_TIMEOUT_MS='10s'"},
      {{{"TAIJI_INIT_TIMEOUT_MS", "-5"}}, "TAIJI_INIT_TIMEOUT_MS='-5'"},
      {{{"TAIJI_INIT_TIMEOUT_MS", "9223372036854775808"}},
       "TAIJI_INIT_TIMEOUT_MS='9223372036854775808' is out of range"},
      {{{"TAIJI_CHUNK_BYTES", "1.5M"}}, "TAIJI_CHUNK_BYTES='1.5M' is not a byte size"},
      {{{"TAIJI_CHUNK_BYTES", "M"}}, "TAIJI_CHUNK_BYTES='M' is not a byte size"},
      {{{"TAIJI_CHUNK_BYTES", "4KB"}}, "TAIJI_CHUNK_BYTES='4KB'"},
      {{{"TAIJI_CHUNK_BYTES", "0"}}, "TAIJI_CHUNK_BYTES='0' is not a positive byte size"},
      {{{"TAIJI_CHUNK_BYTES", "2K"}}, "TAIJI_CHUNK_BYTES='2K' is below the minimum 4096"},
      {{{"TAIJI_CHUNK_BYTES", "128M"}}, "TAIJI_CHUNK_BYTES='128M' exceeds the max payload"},
      {{{"TAIJI_CHUNK_BYTES", "16M"}, {"TAIJI_MAX_PAYLOAD_BYTES", "8M"}},
       "TAIJI_MAX_PAYLOAD_BYTES='8M'"},
      {{{"TAIJI_EAGER_BYTES", "65M"}}, "TAIJI_EAGER_BYTES='65M' exceeds the max payload"},
      {{{"TAIJI_UNEXPECTED_BYTES", "17179869184G"}},
       "TAIJI_UNEXPECTED_BYTES='17179869184G' is out of range"},
      {{{"TAIJI_MAX_PAYLOAD_BYTES", "18446744073709551616"}},
       "TAIJI_MAX_PAYLOAD_BYTES='18446744073709551616' is out of range"},
      // A payload's length must fit libuv's 32-bit buffer length.
      {{{"TAIJI_MAX_PAYLOAD_BYTES", "4G"}},
       "max payload TAIJI_MAX_PAYLOAD_BYTES='4G' exceeds 4294967295 bytes"},
      {{{"TAIJI_CHUNK_BYTES", "5G"}, {"TAIJI_MAX_PAYLOAD_BYTES", "8G"}},
       "TAIJI_MAX_PAYLOAD_BYTES='8G' exceeds 4294967295 bytes"},
      {{{"TAIJI_MAX_NAME_LEN", "65536"}}, "TAIJI_MAX_NAME_LEN='65536' is out of range"},
      {{{"TAIJI_MAX_NAME_LEN", "1K"}}, "TAIJI_MAX_NAME_LEN='1K'"},
      {{{"TAIJI_MAX_NAME_LEN", "3"}}, "TAIJI_MAX_NAME_LEN='3'"},  // shorter than "taiji"
      // Too short for the library's own op names ("taiji.set_topology").
      {{{"TAIJI_MAX_NAME_LEN", "31"}}, "TAIJI_MAX_NAME_LEN='31' is below 32"},
      {{{"TAIJI_TOPOLOGY", "mesh"}}, "TAIJI_TOPOLOGY='mesh': unknown strategy 'mesh'"},
      {{{"TAIJI_LOG_LEVEL", "loud"}}, "TAIJI_LOG_LEVEL='loud' is not one of"},
      {{{"TAIJI_LOG_LEVEL", "WARN"}}, "TAIJI_LOG_LEVEL='WARN'"},
      {{{"TAIJI_METRICS", "on"}}, "TAIJI_METRICS='on' must be 0 or 1"},
      {{{"TAIJI_FUSION", "yes"}}, "TAIJI_FUSION='yes' must be on, off, 1 or 0"},
      {{{"TAIJI_PROGRESS", "busy"}},
       "progress mode TAIJI_PROGRESS='busy' is not one of adaptive, blocking"},
      {{{"TAIJI_SHM", "on"}}, "shared-memory mode TAIJI_SHM='on' is not one of auto, off"},
      // Truncated to an int, 4294967296 would be 0 and refuse every connection.
      {{{"TAIJI_MAX_PENDING_CONNECTIONS", "4294967296"}}, "TAIJI_MAX_PENDING_CONNECTIONS='4294967296' is out of range"},
      {{{"TAIJI_MAX_PENDING_CONNECTIONS", "65537"}}, "TAIJI_MAX_PENDING_CONNECTIONS='65537' is out of range"},
      {{{"TAIJI_MAX_PENDING_CONNECTIONS", "0"}}, "TAIJI_MAX_PENDING_CONNECTIONS='0'"},
  };
  for (const Case& c : cases) {
    std::string m = error(c.env);
    INFO("expected: " << c.fragment << "; got: " << m);
    CHECK(contains(m, c.fragment));
  }
}

TEST_CASE("invalid explicit values are rejected", "[config]") {
  auto err = [](auto set) {
    Config c;
    set(c);
    return error({}, c);
  };
  CHECK(contains(err([](Config& c) { c.rank = -2; }), "rank=-2"));
  CHECK(contains(err([](Config& c) { c.size = 0; }), "size=0"));
  CHECK(contains(err([](Config& c) { c.rank = 1; }), "rank=1 is set but no world size"));
  CHECK(contains(err([](Config& c) { c.size = 3; }), "size=3 is set but no rank"));
  CHECK(contains(err([](Config& c) { c.rank = 3; c.size = 3; c.rendezvous = "h:1"; }),
                 "rank=3 is not below the world size size=3"));
  CHECK(contains(err([](Config& c) { c.rank = 0; c.size = 2; }),
                 "world size size=2 needs a rendezvous"));
  CHECK(contains(err([](Config& c) { c.rendezvous = "a:b:c"; }), "rendezvous='a:b:c'"));
  CHECK(contains(err([](Config& c) { c.timeout_ms = -1; }), "timeout_ms=-1"));
  CHECK(contains(err([](Config& c) { c.init_timeout_ms = -1; }), "init_timeout_ms=-1"));
  CHECK(contains(err([](Config& c) { c.chunk_bytes = 4095; }), "chunk_bytes=4095"));
  CHECK(contains(err([](Config& c) { c.max_payload = 1ull << 32; }),
                 "max payload max_payload=4294967296 exceeds 4294967295 bytes"));
  CHECK(contains(err([](Config& c) {
                   c.eager_bytes = 1;
                   c.max_payload = 8192;
                   c.chunk_bytes = 16384;
                 }),
                 "chunk_bytes=16384 exceeds the max payload max_payload=8192"));
  CHECK(contains(err([](Config& c) { c.max_name_len = 70000; }), "max_name_len=70000"));
  CHECK(contains(err([](Config& c) { c.topology = "hypercube"; }), "'hypercube'"));
  CHECK(contains(err([](Config& c) { c.log_level = "verbose"; }), "'verbose'"));
  CHECK(contains(err([](Config& c) { c.metrics = 2; }), "metrics=2 must be 0, 1 or -1 (unset)"));
  CHECK(contains(err([](Config& c) { c.fusion = -2; }), "fusion=-2 must be 0, 1 or -1 (unset)"));
  CHECK(contains(err([](Config& c) { c.host_rendezvous = 2; }),
                 "host_rendezvous=2 must be 0, 1 or -1 (auto)"));
  CHECK(contains(err([](Config& c) { c.job_id = std::string(300, 'j'); }), "max_name_len"));
  for (const char* level : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    Config c;
    c.log_level = level;
    CHECK(ok({}, c).log_level == level);
  }
  for (const char* topo : {"ring", "tree", "star"}) {
    CHECK(ok({{"TAIJI_TOPOLOGY", topo}}).topology == topo);
  }
  // A built-in name with the whitespace the grammar allows is only checked too, not built:
  // for two billion ranks a ring would be 4 * 10^18 parents.
  Env huge = {{"TAIJI_RANK", "0"}, {"TAIJI_WORLD_SIZE", "2000000000"}, {"TAIJI_RENDEZVOUS", "h:1"},
              {"TAIJI_TOPOLOGY", "\t ring \n"}};
  CHECK(ok(huge).topology == "\t ring \n");
}

TEST_CASE("config: timeouts past a year count as a year, where clock arithmetic cannot overflow",
          "[config]") {
  constexpr int64_t kYearMs = 365LL * 24 * 3600 * 1000;
  Config c = ok({{"TAIJI_TIMEOUT_MS", "9223372036854775807"}, {"TAIJI_INIT_TIMEOUT_MS", "10000000000000"},
                 {"TAIJI_HANDSHAKE_TIMEOUT_MS", "31536000001"}});
  CHECK(c.timeout_ms == kYearMs);
  CHECK(c.init_timeout_ms == kYearMs);
  CHECK(c.handshake_timeout_ms == kYearMs);
  Config explicit_values;
  explicit_values.timeout_ms = INT64_MAX;
  explicit_values.init_timeout_ms = kYearMs - 1;
  c = ok({}, explicit_values);
  CHECK(c.timeout_ms == kYearMs);
  CHECK(c.init_timeout_ms == kYearMs - 1);
  CHECK(ok({{"TAIJI_MAX_PENDING_CONNECTIONS", "65536"}}).max_pending_connections == 65536);
  Config pending;
  pending.max_pending_connections = 70000;
  CHECK(contains(error({}, pending), "max_pending_connections=70000 is not in 1..65536"));
}

TEST_CASE("config: the job id and host label fit the rendezvous store", "[config]") {
  // Peers publish "<address>\n<host label>" under "<job id>/addr/<rank>": a longer job id
  // would fail every rank's bootstrap with a store error instead of this one.
  CHECK(contains(error({{"TAIJI_MAX_NAME_LEN", "4096"}, {"TAIJI_JOB_ID", std::string(1100, 'j')}}),
                 "is longer than 992 bytes (the rendezvous key holds it)"));
  CHECK(ok({{"TAIJI_MAX_NAME_LEN", "4096"}, {"TAIJI_JOB_ID", std::string(992, 'j')}}).job_id.size() == 992);
  CHECK(contains(error({{"TAIJI_HOST", std::string(5000, 'h')}}), "is longer than 4096 bytes"));
}

TEST_CASE("parse_host_port", "[config]") {
  std::string host = "unchanged";
  uint16_t port = 7;
  auto good = [&](const std::string& s, const std::string& h, uint16_t p, bool zero = false) {
    INFO(s);
    Status st = parse_host_port(s, &host, &port, zero);
    INFO(st.message());
    REQUIRE(st.is_ok());
    CHECK(host == h);
    CHECK(port == p);
  };
  good("localhost:80", "localhost", 80);
  good("10.0.0.1:65535", "10.0.0.1", 65535);
  good("node-7.cluster:1", "node-7.cluster", 1);
  good("[::1]:29500", "::1", 29500);
  good("[fe80::1%eth0]:9", "fe80::1%eth0", 9);
  good("h:0", "h", 0, true);
  good("[::]:0", "::", 0, true);

  const std::vector<std::string> bad = {
      "",         "localhost", "localhost:", ":80",       "h:0",      "h:65536",
      "h:-1",     "h:80x",     "h: 80",     "h:+80",     "::1:80",   "[::1]",
      "[::1]80",  "[::1:80",   "[]:80",     "h:99999999999999999999", "a]:1",
      "[a]b]:1",  "h h:1",
  };
  for (const std::string& s : bad) {
    host = "unchanged";
    port = 7;
    Status st = parse_host_port(s, &host, &port);
    INFO("input '" << s << "': " << st.message());
    CHECK_FALSE(st.is_ok());
    CHECK(st.code() == Code::InvalidArgument);
    CHECK(contains(st.message(), "'" + s + "'"));
    CHECK(host == "unchanged");
    CHECK(port == 7);
  }
  CHECK(contains(parse_host_port("::1:80", &host, &port).message(), "brackets"));
}

TEST_CASE("shared memory: auto by default, off on request, ring size bounded", "[config]") {
  Config c = ok({});
  CHECK(c.shm == "auto");
  CHECK(c.shm_ring_bytes == 4u << 20);  // four default chunks
  CHECK(ok({{"TAIJI_CHUNK_BYTES", "4M"}}).shm_ring_bytes == 16u << 20);
  CHECK(ok({{"TAIJI_CHUNK_BYTES", "16K"}}).shm_ring_bytes == 64u << 10);
  CHECK(ok({{"TAIJI_CHUNK_BYTES", "4M"}, {"TAIJI_SHM_RING_BYTES", "1M"}}).shm_ring_bytes == 1u << 20);
  c = ok({{"TAIJI_SHM", "off"}, {"TAIJI_SHM_RING_BYTES", "64K"}});
  CHECK(c.shm == "off");
  CHECK(c.shm_ring_bytes == 64u << 10);
  CHECK(contains(error({{"TAIJI_SHM", "on"}}), "TAIJI_SHM='on' is not one of auto, off"));
  CHECK(contains(error({{"TAIJI_SHM_RING_BYTES", "32K"}}), "TAIJI_SHM_RING_BYTES='32K' is not between"));
  CHECK(contains(error({{"TAIJI_SHM_RING_BYTES", "17G"}}), "is not between 65536 and 17179869184"));
}

TEST_CASE("config: TCP congestion control is the system's unless TAIJI_TCP_CONGESTION names one", "[config]") {
  CHECK(ok({}).tcp_congestion.empty());
  CHECK(ok({{"TAIJI_TCP_CONGESTION", "cubic"}}).tcp_congestion == "cubic");
  CHECK(ok({{"TAIJI_TCP_CONGESTION", "dctcp_2"}}).tcp_congestion == "dctcp_2");
  for (const char* bad : {"Cubic", "cu bic", "cubic;", "a_name_of_sixteen"}) {
    CAPTURE(bad);
    CHECK(contains(error({{"TAIJI_TCP_CONGESTION", bad}}),
                   "TCP congestion control TAIJI_TCP_CONGESTION='" + std::string(bad) + "' is not a name"));
  }
}

TEST_CASE("config: fusion is off unless TAIJI_FUSION turns it on; its sizes are checked", "[config]") {
  Config c = ok({});
  CHECK(c.fusion == 0);
  CHECK(c.fusion_max_op_bytes == 64 * 1024);
  CHECK(c.fusion_buffer_bytes == 4 * 1024 * 1024);
  CHECK(ok({{"TAIJI_FUSION", "on"}}).fusion == 1);
  CHECK(ok({{"TAIJI_FUSION", "0"}}).fusion == 0);
  CHECK(ok({{"TAIJI_FUSION_BUFFER_BYTES", "8M"}}).fusion_buffer_bytes == 8u << 20);
  CHECK(contains(error({{"TAIJI_FUSION", "yes"}}), "TAIJI_FUSION"));
  CHECK(contains(error({{"TAIJI_FUSION_MAX_OP_BYTES", "1M"}, {"TAIJI_FUSION_BUFFER_BYTES", "64K"}}),
                 "fusion buffer"));
}

TEST_CASE("config: the cluster version a process joins at", "[config]") {
  CHECK(ok({}).cluster_version == 1);
  CHECK(ok({{"TAIJI_CLUSTER_VERSION", "7"}}).cluster_version == 7);
  CHECK(ok({{"TAIJI_CLUSTER_VERSION", "4294967295"}}).cluster_version == 4294967295u);
  CHECK(contains(error({{"TAIJI_CLUSTER_VERSION", "0"}}), "TAIJI_CLUSTER_VERSION='0' is not a positive integer"));
  CHECK(contains(error({{"TAIJI_CLUSTER_VERSION", "4294967296"}}), "TAIJI_CLUSTER_VERSION='4294967296' is out of range"));
}
