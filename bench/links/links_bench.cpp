// taiji-links-bench: allreduce on every built-in strategy and on the one computed from the
// measured links, side by side in one run (--sweep); or a timeline of allreduce steps under
// the measured_topology policy while a command changes the network mid-run (--adapt).
// Every process of the job runs it under taiji-run; rank 0 prints. Each iteration's time is
// the slowest rank's; every result is checked (exits 1 on a wrong one, 2 on an error).
#include <taiji/taiji.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Options {
  bool adapt = false;
  uint64_t bytes = uint64_t{32} << 20;
  int iters = 5;
  int warmup = 1;
  uint64_t probe_bytes = uint64_t{4} << 20;
  int throttle_at = -1;          // --adapt: iteration after which rank 0 runs the command
  std::string throttle_cmd;
  std::string policy = "measured_topology first=0 window=3 gain=1.2";
};

int g_rank = -1;

[[noreturn]] void die(taiji_peer_t* peer, const char* what, taiji_status_t s) {
  std::fprintf(stderr, "taiji-links-bench[%d]: %s: %s: %s\n", g_rank, what, taiji_status_name(s),
               taiji_peer_last_error(peer));
  std::exit(2);
}

void check(taiji_peer_t* peer, const char* what, taiji_status_t s) {
  if (s != TAIJI_OK) die(peer, what, s);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One checked allreduce of every rank's (rank + 1) over n floats; the slowest rank's time.
double timed_allreduce(taiji_peer_t* peer, std::vector<float>& x, std::vector<float>& y, const char* name) {
  const int size = taiji_peer_size(peer);
  std::fill(x.begin(), x.end(), static_cast<float>(g_rank + 1));
  const double t0 = now_s();
  check(peer, "allreduce", taiji_allreduce(peer, name, x.data(), y.data(), x.size(), TAIJI_F32, TAIJI_SUM, nullptr,
                                           nullptr));
  double t = now_s() - t0;
  const float want = static_cast<float>(size * (size + 1) / 2);
  if (y.front() != want || y.back() != want || y[y.size() / 2] != want) {
    std::fprintf(stderr, "taiji-links-bench[%d]: wrong sum %g, want %g\n", g_rank, y.front(), want);
    std::exit(1);
  }
  check(peer, "max time", taiji_allreduce(peer, "bench.links.time", &t, &t, 1, TAIJI_F64, TAIJI_MAX, nullptr,
                                          nullptr));
  return t;
}

taiji_topology_t* topology_of(taiji_peer_t* peer, const char* name) {
  taiji_topology_t* t = nullptr;
  check(peer, name, taiji_topology_from_text(peer, name, taiji_peer_size(peer), &t));
  return t;
}

void set_topology(taiji_peer_t* peer, const taiji_topology_t* t) {
  taiji_op_options_t o = TAIJI_OP_OPTIONS_INIT;
  check(peer, "set topology", taiji_set_topology(peer, t, &o, nullptr));
}

void sweep(taiji_peer_t* peer, const Options& o) {
  taiji_measure_options_t mo = TAIJI_MEASURE_OPTIONS_INIT;
  mo.probe_bytes = o.probe_bytes;
  taiji_link_matrix_t* m = nullptr;
  const double t0 = now_s();
  check(peer, "measure links", taiji_measure_links(peer, &mo, &m));
  const double measure_s = now_s() - t0;
  taiji_optimize_options_t oo = TAIJI_OPTIMIZE_OPTIONS_INIT;
  oo.bytes = o.bytes;
  taiji_topology_t* best = nullptr;
  char why[1024];
  check(peer, "optimize", taiji_optimize_topology(peer, m, &oo, &best, why, sizeof(why)));
  const int n = taiji_peer_size(peer);
  if (g_rank == 0) {
    std::printf("# links measured in %.2f s (probe %llu B); bandwidth MB/s, row = sender:\n", measure_s,
                static_cast<unsigned long long>(o.probe_bytes));
    for (int s = 0; s < n; ++s) {
      std::printf("#  %2d:", s);
      for (int d = 0; d < n; ++d) std::printf(" %8.1f", taiji_link_bandwidth(m, s, d) / 1e6);
      std::printf("\n");
    }
    std::printf("# optimiser: %s\n", why);
    std::printf("# %-24s %12s %12s %12s\n", "strategy", "time(s)", "busbw(GB/s)", "predicted(s)");
  }
  std::vector<const char*> names = {"star", "ring", "clique", "tree", "binary_tree", "binary_tree_star",
                                    "multi_binary_tree_star", "hierarchical", "measured"};
  std::vector<float> x(o.bytes / sizeof(float)), y(x.size());
  double best_builtin = 0, ring = 0, measured = 0;
  for (const char* name : names) {
    const bool is_measured = std::strcmp(name, "measured") == 0;
    taiji_topology_t* t = is_measured ? best : topology_of(peer, name);
    set_topology(peer, t);
    std::vector<double> times;
    for (int i = 0; i < o.warmup + o.iters; ++i) {
      const double s = timed_allreduce(peer, x, y, "bench.links");
      if (i >= o.warmup) times.push_back(s);
    }
    const double med = median(times);
    const double busbw = 2.0 * (n - 1) / n * static_cast<double>(o.bytes) / med / 1e9;
    if (g_rank == 0) {
      std::printf("  %-24s %12.4f %12.4f %12.4f\n", name, med, busbw, taiji_predict_allreduce(t, m, o.bytes));
    }
    if (is_measured) {
      measured = med;
    } else {
      best_builtin = best_builtin == 0 ? med : std::min(best_builtin, med);
      if (std::strcmp(name, "ring") == 0) ring = med;
      taiji_topology_destroy(t);
    }
  }
  if (g_rank == 0) {
    std::printf("# measured vs best built-in: %.2fx; vs ring (the default at this size): %.2fx\n",
                best_builtin / measured, ring / measured);
  }
  taiji_topology_destroy(best);
  taiji_link_matrix_destroy(m);
}

void adapt(taiji_peer_t* peer, const Options& o) {
  taiji_adapt_t* e = nullptr;
  check(peer, "adapt create", taiji_adapt_create(peer, &e));
  check(peer, "adapt policy", taiji_adapt_add_policy(e, o.policy.c_str()));
  std::vector<float> x(o.bytes / sizeof(float)), y(x.size());
  const int n = taiji_peer_size(peer);
  if (g_rank == 0) std::printf("# %5s %10s %12s  %s\n", "iter", "time(s)", "busbw(GB/s)", "action");
  for (int i = 0; i < o.iters; ++i) {
    const double s = timed_allreduce(peer, x, y, "bench.links");
    taiji_action_t actions[4] = {TAIJI_ACTION_INIT, TAIJI_ACTION_INIT, TAIJI_ACTION_INIT, TAIJI_ACTION_INIT};
    size_t count = 0;
    check(peer, "adapt step", taiji_adapt_step(e, 1, 0, actions, 4, &count));
    if (g_rank == 0) {
      const double busbw = 2.0 * (n - 1) / n * static_cast<double>(o.bytes) / s / 1e9;
      std::printf("  %5d %10.4f %12.4f", i, s, busbw);
      for (size_t k = 0; k < count; ++k) {
        const bool swapped = actions[k].topology != nullptr && actions[k].topology[0] != '\0';
        std::printf("  %s%s: %s", taiji_action_kind_name(actions[k].kind), swapped ? " (swapped)" : "",
                    actions[k].reason);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    if (i == o.throttle_at) {
      if (g_rank == 0 && !o.throttle_cmd.empty()) {
        std::printf("# after iteration %d: %s\n", i, o.throttle_cmd.c_str());
        std::fflush(stdout);
        if (std::system(o.throttle_cmd.c_str()) != 0) std::fprintf(stderr, "taiji-links-bench: the command failed\n");
      }
      check(peer, "barrier", taiji_barrier(peer, "bench.links.throttled", nullptr, nullptr));
    }
  }
  taiji_adapt_destroy(e);
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--sweep") {
      o->adapt = false;
    } else if (a == "--adapt") {
      o->adapt = true;
    } else if ((a == "--bytes" || a == "--iters" || a == "--warmup" || a == "--probe-bytes" || a == "--throttle-at" ||
                a == "--throttle-cmd" || a == "--policy") &&
               (v = value()) != nullptr) {
      if (a == "--bytes") o->bytes = std::strtoull(v, nullptr, 10);
      if (a == "--iters") o->iters = std::atoi(v);
      if (a == "--warmup") o->warmup = std::atoi(v);
      if (a == "--probe-bytes") o->probe_bytes = std::strtoull(v, nullptr, 10);
      if (a == "--throttle-at") o->throttle_at = std::atoi(v);
      if (a == "--throttle-cmd") o->throttle_cmd = v;
      if (a == "--policy") o->policy = v;
    } else {
      return false;
    }
  }
  return o->bytes >= sizeof(float) && o->iters >= 1 && o->warmup >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: taiji-links-bench [--sweep | --adapt] [--bytes B] [--iters N] [--warmup N]\n"
                 "         [--probe-bytes B] [--throttle-at I --throttle-cmd CMD] [--policy SPEC]\n");
    return 2;
  }
  taiji_config_t config = TAIJI_CONFIG_INIT;
  taiji_peer_t* peer = nullptr;
  if (taiji_status_t s = taiji_peer_init(&config, &peer); s != TAIJI_OK) die(nullptr, "init", s);
  g_rank = taiji_peer_rank(peer);
  if (o.adapt) {
    adapt(peer, o);
  } else {
    sweep(peer, o);
  }
  check(peer, "finalize", taiji_peer_finalize(peer));
  taiji_peer_destroy(peer);
  return 0;
}
