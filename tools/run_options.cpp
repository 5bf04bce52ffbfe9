#include "run_options.h"
#include "bootstrap/etcd_store.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace taiji_run {

namespace {

const char kUsage[] =
    "usage: taiji-run -np N [options] [--] prog [args...]\n"
    "       taiji-run --hosts h1:n1,h2:n2,... --self hK [options] [--] prog [args...]\n"
    "       taiji-run -np N --elastic [--min-np MIN] [--max-np MAX] [options] [--] prog [args...]\n"
    "       taiji-run --hosts LIST --self hK --elastic [-np N] [options] [--] prog [args...]\n"
    "       taiji-run --resize N --store ADDR --job-id ID [--timeout SECS]\n"
    "\n"
    "Starts the ranks of a taiji job. Each rank gets TAIJI_RANK, TAIJI_WORLD_SIZE,\n"
    "TAIJI_LOCAL_RANK, TAIJI_LOCAL_SIZE, TAIJI_RENDEZVOUS, TAIJI_RENDEZVOUS_HOST=0,\n"
    "TAIJI_JOB_ID and TAIJI_LISTEN_HOST; its output is printed prefixed with \"[rank] \".\n"
    "If one rank fails, the others get SIGTERM (SIGKILL 3 s later) and taiji-run exits\n"
    "with the failing rank's code (128 + signal number when it was killed).\n"
    "\n"
    "options:\n"
    "  -np N             number of ranks (single host: required; with --hosts: optional,\n"
    "                    must equal the sum of the counts, or with --elastic be at most it)\n"
    "  --hosts LIST      multi-host job: host:count entries in rank order (the ranks of the\n"
    "                    first entry come first). Every host runs the same command with its\n"
    "                    own --self; the first host serves the rendezvous on its address.\n"
    "  --self HOST       this host's entry in --hosts (also its TAIJI_LISTEN_HOST)\n"
    "  --port P          rendezvous port (default: 29400 with --hosts, any free port without)\n"
    "  --job-id ID       TAIJI_JOB_ID (default: job-<pid>-<time>)\n"
    "  --store ADDR      meet in the etcd store etcd://HOST:PORT/PREFIX instead of serving\n"
    "                    the rendezvous here (every host of a job names the same one)\n"
    "  --timeout SECS    stop the job after SECS seconds and exit with code 124\n"
    "  --no-tag          pass output lines through without the rank prefix\n"
    "  --secret          generate a random job secret for this job (single host): ranks get\n"
    "                    TAIJI_SECRET_FILE naming an owner-only file removed at exit, and\n"
    "                    every connection between them is authenticated\n"
    "  --secret-file F   every rank authenticates with the secret in F (TAIJI_SECRET_FILE);\n"
    "                    for multi-host jobs, F must hold the same secret on every host\n"
    "  --elastic         follow the job's membership in the store: start the ranks a grow\n"
    "                    asks for (with --hosts: on hosts with free slots, claimed through the\n"
    "                    store); a rank that fails or is dropped leaves the job instead of\n"
    "                    stopping it, down to --min-np (see docs/launcher.md)\n"
    "  --min-np MIN      elastic: stop the job when fewer than MIN ranks are left (default 1)\n"
    "  --max-np MAX      elastic: never run more than MAX ranks (default 1048576)\n"
    "  --resize N        ask the elastic job --job-id for N ranks and exit: writes the request\n"
    "                    into its store --store (the host:port its taiji-run printed, fixed\n"
    "                    with that job's --port, or etcd://...); --timeout bounds the wait for\n"
    "                    the store (default 5 s)\n"
    "  -h, --help        print this help\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "taiji-run: %s\n\n%s", message.c_str(), kUsage);
  std::exit(2);
}

bool parse_int(const std::string& s, long min, long max, long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < min || v > max) return false;
  *out = v;
  return true;
}

std::string unbracketed(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

std::vector<HostEntry> parse_hosts(const std::string& list) {
  std::vector<HostEntry> hosts;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string item = list.substr(start, comma == std::string::npos ? comma : comma - start);
    size_t colon = item.rfind(':');
    long n = 0;
    if (colon == std::string::npos || colon == 0 ||
        !parse_int(item.substr(colon + 1), 1, 1 << 20, &n)) {
      usage_error("bad --hosts entry '" + item + "' (expected host:count, count >= 1)");
    }
    hosts.push_back({unbracketed(item.substr(0, colon)), static_cast<int>(n)});
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return hosts;
}

// The client mode takes the store, the job and a bound on the wait, nothing that starts ranks.
void check_resize(const Options& o, bool rank_options) {
  if (!o.command.empty() || o.np != -1 || o.elastic || rank_options || !o.self.empty() ||
      o.port >= 0 || o.generate_secret || !o.secret_file.empty()) {
    usage_error("--resize asks a running job to resize and starts no ranks: it takes only "
                "--store, --job-id and --timeout");
  }
  if (o.store.empty()) usage_error("--resize needs --store (the job's store address)");
  if (o.job_id.empty()) usage_error("--resize needs --job-id (the job's TAIJI_JOB_ID)");
  if (o.store.rfind("etcd://", 0) == 0) {
    if (std::string why = taiji::EtcdStore::check_address(o.store); !why.empty()) {
      usage_error("bad --store '" + o.store + "': " + why);
    }
    return;
  }
  size_t colon = o.store.rfind(':');
  long port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !parse_int(o.store.substr(colon + 1), 1, 65535, &port)) {
    usage_error("bad --store '" + o.store + "' (expected host:port or etcd://HOST:PORT/PREFIX)");
  }
}

}  // namespace

Options parse_run_options(int argc, char** argv) {
  Options o;
  bool have_hosts = false, have_min = false, have_max = false;
  int i = 1;
  auto value = [&](const std::string& arg, const std::string& name) -> std::string {
    if (arg.size() > name.size() && arg[name.size()] == '=') return arg.substr(name.size() + 1);
    if (i + 1 >= argc) usage_error(name + " needs a value");
    return argv[++i];
  };
  auto is = [](const std::string& arg, const std::string& name) {
    return arg == name || arg.rfind(name + "=", 0) == 0;
  };
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    long n = 0;
    if (arg == "--") {
      ++i;
      break;
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (is(arg, "-np")) {
      std::string v = value(arg, "-np");
      if (!parse_int(v, 1, 1 << 20, &n)) usage_error("bad -np '" + v + "'");
      o.np = static_cast<int>(n);
    } else if (is(arg, "--hosts")) {
      o.hosts = parse_hosts(value(arg, "--hosts"));
      have_hosts = true;
    } else if (is(arg, "--self")) {
      o.self = unbracketed(value(arg, "--self"));
    } else if (is(arg, "--port")) {
      std::string v = value(arg, "--port");
      if (!parse_int(v, 0, 65535, &n)) usage_error("bad --port '" + v + "'");
      o.port = static_cast<int>(n);
    } else if (is(arg, "--store")) {
      o.store = value(arg, "--store");  // checked below: --resize also takes host:port
    } else if (is(arg, "--job-id")) {
      o.job_id = value(arg, "--job-id");
      if (o.job_id.empty()) usage_error("--job-id must not be empty");
    } else if (is(arg, "--timeout")) {
      std::string v = value(arg, "--timeout");
      char* end = nullptr;
      o.timeout_s = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(o.timeout_s > 0) || o.timeout_s > 1e9) {
        usage_error("bad --timeout '" + v + "' (seconds, > 0)");
      }
    } else if (arg == "--elastic") {
      o.elastic = true;
    } else if (is(arg, "--min-np")) {
      std::string v = value(arg, "--min-np");
      if (!parse_int(v, 1, 1 << 20, &n)) usage_error("bad --min-np '" + v + "'");
      o.min_np = static_cast<int>(n);
      have_min = true;
    } else if (is(arg, "--max-np")) {
      std::string v = value(arg, "--max-np");
      if (!parse_int(v, 1, 1 << 20, &n)) usage_error("bad --max-np '" + v + "'");
      o.max_np = static_cast<int>(n);
      have_max = true;
    } else if (is(arg, "--resize")) {
      std::string v = value(arg, "--resize");
      if (!parse_int(v, 1, 1 << 20, &n)) usage_error("bad --resize '" + v + "' (ranks, >= 1)");
      o.resize = static_cast<int>(n);
    } else if (arg == "--no-tag") {
      o.tag = false;
    } else if (arg == "--secret") {
      o.generate_secret = true;
    } else if (is(arg, "--secret-file")) {
      o.secret_file = value(arg, "--secret-file");
      if (o.secret_file.empty()) usage_error("--secret-file must not be empty");
    } else if (arg.size() > 1 && arg[0] == '-') {
      usage_error("unknown option '" + arg + "'");
    } else {
      break;
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (o.resize > 0) {
    check_resize(o, have_hosts || have_min || have_max);
    return o;
  }
  if (!o.store.empty()) {
    if (std::string why = taiji::EtcdStore::check_address(o.store); !why.empty()) {
      usage_error("bad --store '" + o.store + "': " + why);
    }
  }
  if (o.command.empty()) usage_error("no program given");
  if ((have_min || have_max) && !o.elastic) usage_error("--min-np and --max-np need --elastic");
  if (o.generate_secret && !o.secret_file.empty()) {
    usage_error("--secret and --secret-file exclude each other");
  }
  if (have_hosts) {
    if (o.generate_secret) {
      usage_error("--secret generates a secret on one host only; with --hosts, give every "
                  "host the same --secret-file");
    }
    if (o.self.empty()) usage_error("--hosts needs --self (this host's entry)");
    long sum = 0;
    int matches = 0;
    for (const auto& h : o.hosts) {
      sum += h.count;
      matches += h.host == o.self;
    }
    if (sum > (1 << 20)) usage_error("--hosts lists more than 1048576 ranks");
    if (matches != 1) usage_error("--self '" + o.self + "' must name exactly one --hosts entry");
    // Elastic: the counts are the hosts' slots, and the job may start on fewer of them.
    if (o.elastic && o.np > sum) {
      usage_error("-np " + std::to_string(o.np) + " is more than the " + std::to_string(sum) +
                  " slots listed in --hosts");
    }
    if (!o.elastic && o.np != -1 && o.np != sum) {
      usage_error("-np " + std::to_string(o.np) + " differs from the " + std::to_string(sum) +
                  " ranks listed in --hosts");
    }
    if (o.np == -1 || !o.elastic) o.np = static_cast<int>(sum);
    if (o.port >= 0 && !o.store.empty()) usage_error("--port and --store exclude each other");
    if (o.port == 0) usage_error("--port must be 1..65535 with --hosts");
    if (o.port < 0) o.port = 29400;
  } else {
    if (!o.self.empty()) usage_error("--self needs --hosts");
    if (o.np < 1) usage_error("-np N is required");
    if (o.port >= 0 && !o.store.empty()) usage_error("--port and --store exclude each other");
    if (o.port < 0) o.port = 0;
  }
  if (o.elastic && !(o.min_np <= o.np && o.np <= o.max_np)) {
    usage_error("--elastic needs --min-np <= -np <= --max-np (here " + std::to_string(o.min_np) +
                " <= " + std::to_string(o.np) + " <= " + std::to_string(o.max_np) + " fails)");
  }
  return o;
}

}  // namespace taiji_run
