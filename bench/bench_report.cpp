#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "bench.h"

namespace taiji_bench {
namespace {

// A barrier moves no data, so it has no element type and nothing to check.
const char* dtype_label(const RunInfo& info) {
  return info.options->op == OpKind::kBarrier ? "-" : info.options->dtype->name;
}

bool checks_data(const Options& o) { return o.check && o.op != OpKind::kBarrier; }

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Checks the stream's error state at close, so that a full disk is not mistaken for
// success.
class OutFile {
 public:
  OutFile(const std::string& path, std::string* error) : path_(path), error_(error) {
    f_ = std::fopen(path.c_str(), "w");
    if (f_ == nullptr) *error_ = "cannot open " + path + ": " + std::strerror(errno);
  }
  ~OutFile() {
    if (f_ != nullptr) std::fclose(f_);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  FILE* get() const { return f_; }
  bool close() {
    if (f_ == nullptr) return false;
    bool ok = std::ferror(f_) == 0;
    ok = std::fclose(f_) == 0 && ok;
    f_ = nullptr;
    if (!ok) *error_ = "cannot write " + path_ + ": " + std::strerror(errno);
    return ok;
  }

 private:
  std::string path_;
  std::string* error_;
  FILE* f_ = nullptr;
};

// Short column labels keep an eight-strategy table within a terminal's width.
std::string column_label(const std::string& name) {
  if (name == "binary_tree_star") return "bt_star";
  if (name == "multi_binary_tree_star") return "multi_bt_star";
  return name;
}

// The figure a strategy is judged by: busbw (higher wins) or, without bandwidth, the
// time (lower wins).
double score(const Row& r) { return r.has_bandwidth ? r.busbw_gbps : r.time_us; }
bool better(const Row& a, const Row& b) {
  return a.has_bandwidth ? a.busbw_gbps > b.busbw_gbps : a.time_us < b.time_us;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

}  // namespace

void print_header(const RunInfo& info) {
  const Options& o = *info.options;
  std::printf("# taiji-bench: op %s", op_name(o.op));
  if (o.op != OpKind::kBarrier) std::printf("  dtype %s", dtype_label(info));
  if (o.op == OpKind::kAllreduce) std::printf("  redop %s", redop_name(o.redop));
  if (o.op == OpKind::kBroadcast) std::printf("  root %d", o.root);
  std::printf("  world %d  topology %s  taiji %s\n", info.world, info.topology.c_str(),
              info.version.c_str());
  if (o.op == OpKind::kBarrier) {
    std::printf("# no payload");
  } else if (o.swap_at) {
    std::printf("# size %s", format_bytes(o.max_bytes).c_str());
  } else {
    std::printf("# sizes %s .. %s, x%" PRIu64, format_bytes(o.min_bytes).c_str(),
                format_bytes(o.max_bytes).c_str(), o.step_factor);
  }
  std::string iters = o.iters ? std::to_string(*o.iters)
                      : o.swap_at ? std::to_string(kDefaultSwapIters)
                                  : "adaptive";
  std::string warmup = o.warmup ? std::to_string(*o.warmup) : "auto";
  std::printf("  iters %s  warmup %s  timeout %" PRId64 " ms  check %s\n", iters.c_str(),
              warmup.c_str(), o.timeout_ms, checks_data(o) ? "on" : "off");
  if (o.swap_at) {
    std::printf("# time: the slowest peer's time for each iteration\n");
  } else {
    std::printf("# time: median over iterations of the slowest peer's time per iteration\n");
  }
  if (o.sweep_topologies.empty() && !o.swap_at) {
    std::printf("#\n");
    std::printf("# %12s %12s %6s %12s %12s %12s %6s\n", "size(B)", "count", "dtype",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "check");
  }
  std::fflush(stdout);
}

void print_row(const RunInfo& info, const Row& row) {
  if (row.has_bandwidth) {
    std::printf("  %12" PRIu64 " %12zu %6s %12.2f %12.3f %12.3f %6s\n", row.bytes, row.count,
                dtype_label(info), row.time_us, row.algbw_gbps, row.busbw_gbps, row.check);
  } else {
    std::printf("  %12" PRIu64 " %12zu %6s %12.2f %12s %12s %6s\n", row.bytes, row.count,
                dtype_label(info), row.time_us, "-", "-", row.check);
  }
  std::fflush(stdout);
}

void print_footer(const RunInfo& info, const std::vector<Row>& rows, bool all_ok) {
  double sum = 0;
  int n = 0;
  for (const Row& r : rows) {
    // A wrong result's speed says nothing: failed rows are left out.
    if (!r.has_bandwidth || std::strcmp(r.check, "FAIL") == 0) continue;
    sum += r.busbw_gbps;
    ++n;
  }
  std::printf("#\n");
  if (n > 0) std::printf("# avg busbw: %.3f GB/s over %d sizes (rows that passed)\n", sum / n, n);
  if (checks_data(*info.options)) {
    std::printf("# check: %s\n", all_ok ? "all ok" : "FAILED (see rows marked FAIL)");
  }
  std::fflush(stdout);
}

void print_metrics_comparison(const RunInfo& info, const std::vector<Row>& rows) {
  const int world = info.world;
  auto busbw = [&](uint64_t bytes, double us) {
    if (us <= 0) return 0.0;
    double algbw = static_cast<double>(bytes) / (us * 1e-6) / 1e9;
    return info.options->op == OpKind::kAllreduce ? algbw * 2.0 * (world - 1) / world : algbw;
  };
  std::printf("#\n# metrics off vs on: medians of alternating iterations (slowest peer each)\n");
  std::printf("# %12s %8s %12s %12s %12s %12s %9s\n", "size(B)", "iters", "off(us)", "on(us)",
              "off busbw", "on busbw", "time +%");
  for (const Row& r : rows) {
    if (!r.compared) continue;
    const double change = r.off_us > 0 ? (r.on_us - r.off_us) / r.off_us * 100 : 0;
    std::printf("  %12llu %8d %12.1f %12.1f %12.4f %12.4f %+8.2f%%\n",
                static_cast<unsigned long long>(r.bytes), r.iters, r.off_us, r.on_us,
                busbw(r.bytes, r.off_us), busbw(r.bytes, r.on_us), change);
  }
  std::fflush(stdout);
}

void print_sweep_table(const RunInfo& info, const std::vector<std::string>& names,
                       const std::vector<uint64_t>& digests,
                       const std::vector<std::vector<Row>>& rows, bool all_ok) {
  constexpr int kWidth = 13;
  const bool bandwidth = info.options->op != OpKind::kBarrier;
  auto same_graphs = [&](size_t a, size_t b) {
    return digests.size() == names.size() && digests[a] != 0 && digests[a] == digests[b];
  };
  std::printf("#\n# %s per topology; best: the %s at that size, +N%%: its lead over\n"
              "# the best strategy with other graphs; FAIL: a wrong result\n",
              bandwidth ? "busbw (GB/s)" : "time (us)",
              bandwidth ? "highest busbw" : "lowest time");
  bool abbreviated = false;
  for (const std::string& n : names) abbreviated = abbreviated || column_label(n) != n;
  if (abbreviated) {
    std::printf("# bt_star = binary_tree_star, multi_bt_star = multi_binary_tree_star\n");
  }
  // Built-ins that this job's hosts make identical, so that equal columns are not
  // mistaken for a measurement artefact.
  std::vector<bool> grouped(names.size(), false);
  for (size_t a = 0; a < names.size(); ++a) {
    if (grouped[a]) continue;
    std::string group = names[a];
    for (size_t b = a + 1; b < names.size(); ++b) {
      if (!grouped[b] && same_graphs(a, b)) {
        grouped[b] = true;
        group += " = " + names[b];
      }
    }
    if (group != names[a]) std::printf("# same graphs in this job: %s\n", group.c_str());
  }
  std::printf("#\n# %12s", "size(B)");
  for (const std::string& n : names) std::printf(" %*s", kWidth, column_label(n).c_str());
  std::printf("  best\n");
  const size_t nsizes = rows.empty() ? 0 : rows[0].size();
  std::vector<int> wins(names.size(), 0);
  for (size_t i = 0; i < nsizes; ++i) {
    std::printf("  %12" PRIu64, rows[0][i].bytes);
    int best = -1;
    for (size_t t = 0; t < names.size(); ++t) {
      const Row& r = rows[t][i];
      if (std::strcmp(r.check, "FAIL") == 0) {
        std::printf(" %*s", kWidth, "FAIL");
        continue;
      }
      std::printf(bandwidth ? " %*.4f" : " %*.1f", kWidth, score(r));
      if (best < 0 || better(r, rows[static_cast<size_t>(best)][i])) best = static_cast<int>(t);
    }
    if (best >= 0) {
      const size_t b = static_cast<size_t>(best);
      ++wins[b];
      std::printf("  %s", names[b].c_str());
      int second = -1;
      for (size_t t = 0; t < names.size(); ++t) {
        if (same_graphs(t, b) || t == b || std::strcmp(rows[t][i].check, "FAIL") == 0) continue;
        if (second < 0 || better(rows[t][i], rows[static_cast<size_t>(second)][i])) {
          second = static_cast<int>(t);
        }
      }
      if (second >= 0) {
        double x = score(rows[b][i]);
        double y = score(rows[static_cast<size_t>(second)][i]);
        double lead = bandwidth ? (y > 0 ? x / y - 1 : 0) : (x > 0 ? y / x - 1 : 0);
        std::printf(" +%.0f%%", lead * 100);
      }
    }
    std::printf("\n");
  }
  std::printf("#\n# %12s", bandwidth ? "avg busbw" : "avg time");
  for (size_t t = 0; t < names.size(); ++t) {
    // Failed rows are left out: a wrong result's speed says nothing.
    double sum = 0;
    size_t counted = 0;
    for (const Row& r : rows[t]) {
      if (std::strcmp(r.check, "FAIL") == 0) continue;
      sum += score(r);
      ++counted;
    }
    std::printf(bandwidth ? " %*.4f" : " %*.1f", kWidth,
                counted == 0 ? 0.0 : sum / static_cast<double>(counted));
  }
  std::printf("\n# %12s", "wins");
  for (int w : wins) std::printf(" %*d", kWidth, w);
  std::printf("\n");
  if (checks_data(*info.options)) {
    std::printf("# check: %s\n", all_ok ? "all ok" : "FAILED (see cells marked FAIL)");
  }
  std::fflush(stdout);
}

void print_timeline(const RunInfo& info, const SwapResult& swap, bool all_ok) {
  const bool bandwidth = info.options->op != OpKind::kBarrier;
  std::printf("# %s on %s, taiji_set_topology(%s) by every peer after iteration %d of %zu\n",
              bandwidth ? format_bytes(swap.bytes).c_str() : "barrier", swap.from.c_str(),
              swap.to.c_str(), swap.swap_at, swap.samples.size());
  std::printf("# topology: the built-in whose digest taiji_request_topology_digest gave (the\n"
              "# requested one first: built-ins can coincide, e.g. ring and hierarchical with\n"
              "# one rank per host)\n");
  std::printf("#\n# %6s %12s %12s %12s %-22s %18s %6s\n", "iter", "time(us)", "algbw(GB/s)",
              "busbw(GB/s)", "topology", "digest", "check");
  auto print_swap = [&] {
    std::printf("  %6s %12.2f %12s %12s %-22s %18s %6s\n", "swap", swap.swap_us, "-", "-",
                ("-> " + swap.to).c_str(), hex64(swap.swap_digest).c_str(), "-");
  };
  for (const Sample& s : swap.samples) {
    if (s.iter == swap.swap_at) print_swap();
    if (bandwidth) {
      std::printf("  %6d %12.2f %12.4f %12.4f %-22s %18s %6s\n", s.iter, s.time_us,
                  s.algbw_gbps, s.busbw_gbps, s.topology.c_str(), hex64(s.digest).c_str(),
                  s.check);
    } else {
      std::printf("  %6d %12.2f %12s %12s %-22s %18s %6s\n", s.iter, s.time_us, "-", "-",
                  s.topology.c_str(), hex64(s.digest).c_str(), s.check);
    }
  }
  std::vector<double> before, after;
  for (const Sample& s : swap.samples) {
    (s.iter < swap.swap_at ? before : after).push_back(bandwidth ? s.busbw_gbps : s.time_us);
  }
  const char* what = bandwidth ? "busbw" : "time";
  const char* unit = bandwidth ? "GB/s" : "us";
  std::printf("#\n");
  if (!before.empty()) {
    std::printf("# before the swap: median %s %.4f %s over %zu iterations\n", what,
                median_of(before), unit, before.size());
  }
  if (!after.empty()) {
    std::printf("# after the swap:  median %s %.4f %s over %zu iterations; the first %.4f %s\n",
                what, median_of(after), unit, after.size(), after.front(), unit);
  }
  if (swap.swap_digest != swap.to_digest) {
    // taiji.h promises the digest of the topology in force after the swap.
    std::printf("# note: the swap request's digest %s is not %s's %s\n",
                hex64(swap.swap_digest).c_str(), swap.to.c_str(), hex64(swap.to_digest).c_str());
  }
  if (checks_data(*info.options)) {
    std::printf("# check: %s\n", all_ok ? "all ok" : "FAILED (see rows marked FAIL)");
  }
  std::fflush(stdout);
}

bool write_timeline_csv(const std::string& path, const RunInfo& info, const SwapResult& swap,
                        std::string* error) {
  OutFile out(path, error);
  FILE* f = out.get();
  if (f == nullptr) return false;
  const Options& o = *info.options;
  std::fprintf(f, "op,dtype,world_size,size_bytes,iter,time_us,algbw_gbps,busbw_gbps,"
                  "topology,digest,check\n");
  auto line = [&](const char* iter, double time_us, const char* algbw, const char* busbw,
                  const std::string& topo, uint64_t digest, const char* check) {
    std::fprintf(f, "%s,%s,%d,%" PRIu64 ",%s,%.3f,%s,%s,%s,%s,%s\n", op_name(o.op),
                 dtype_label(info), info.world, swap.bytes, iter, time_us, algbw, busbw,
                 topo.c_str(), hex64(digest).c_str(), check);
  };
  for (const Sample& s : swap.samples) {
    if (s.iter == swap.swap_at) line("swap", swap.swap_us, "", "", swap.to, swap.swap_digest, "");
    char algbw[32] = "";
    char busbw[32] = "";
    if (o.op != OpKind::kBarrier) {
      std::snprintf(algbw, sizeof algbw, "%.6f", s.algbw_gbps);
      std::snprintf(busbw, sizeof busbw, "%.6f", s.busbw_gbps);
    }
    line(std::to_string(s.iter).c_str(), s.time_us, algbw, busbw, s.topology, s.digest,
         s.check);
  }
  return out.close();
}

bool write_timeline_json(const std::string& path, const RunInfo& info, const SwapResult& swap,
                         bool all_ok, std::string* error) {
  OutFile out(path, error);
  FILE* f = out.get();
  if (f == nullptr) return false;
  const Options& o = *info.options;
  std::fprintf(f, "{\n  \"benchmark\": \"taiji-bench\",\n");
  std::fprintf(f, "  \"version\": %s,\n", json_string(info.version).c_str());
  std::fprintf(f, "  \"op\": \"%s\",\n", op_name(o.op));
  if (o.op != OpKind::kBarrier) std::fprintf(f, "  \"dtype\": \"%s\",\n", dtype_label(info));
  std::fprintf(f, "  \"world_size\": %d,\n  \"size_bytes\": %" PRIu64 ",\n", info.world,
               swap.bytes);
  std::fprintf(f, "  \"from\": %s,\n  \"to\": %s,\n  \"swap_at\": %d,\n",
               json_string(swap.from).c_str(), json_string(swap.to).c_str(), swap.swap_at);
  std::fprintf(f, "  \"swap_us\": %.3f,\n  \"swap_digest\": \"%s\",\n", swap.swap_us,
               hex64(swap.swap_digest).c_str());
  std::fprintf(f, "  \"checked\": %s,\n  \"ok\": %s,\n",
               checks_data(o) ? "true" : "false", all_ok ? "true" : "false");
  std::fprintf(f, "  \"iterations\": [");
  for (size_t i = 0; i < swap.samples.size(); ++i) {
    const Sample& s = swap.samples[i];
    std::fprintf(f, "%s\n    {\"iter\": %d, \"time_us\": %.3f, ", i == 0 ? "" : ",", s.iter,
                 s.time_us);
    if (o.op != OpKind::kBarrier) {
      std::fprintf(f, "\"algbw_gbps\": %.6f, \"busbw_gbps\": %.6f, ", s.algbw_gbps,
                   s.busbw_gbps);
    }
    std::fprintf(f, "\"topology\": %s, \"digest\": \"%s\", \"check\": ",
                 json_string(s.topology).c_str(), hex64(s.digest).c_str());
    if (std::strcmp(s.check, "-") == 0) {
      std::fprintf(f, "null}");
    } else {
      std::fprintf(f, "\"%s\"}", s.check);
    }
  }
  std::fprintf(f, "%s]\n}\n", swap.samples.empty() ? "" : "\n  ");
  return out.close();
}

bool write_csv(const std::string& path, const RunInfo& info, const std::vector<Row>& rows,
               std::string* error) {
  OutFile out(path, error);
  FILE* f = out.get();
  if (f == nullptr) return false;
  const Options& o = *info.options;
  std::fprintf(f,
               "op,dtype,redop,world_size,topology,size_bytes,count,iters,warmup,time_us,"
               "min_us,max_us,algbw_gbps,busbw_gbps,check\n");
  for (const Row& r : rows) {
    std::fprintf(f, "%s,%s,%s,%d,%s,%" PRIu64 ",%zu,%d,%d,%.3f,%.3f,%.3f,", op_name(o.op),
                 dtype_label(info), o.op == OpKind::kAllreduce ? redop_name(o.redop) : "",
                 info.world, r.topology.empty() ? info.topology.c_str() : r.topology.c_str(),
                 r.bytes, r.count, r.iters, r.warmup,
                 r.time_us, r.min_us, r.max_us);
    if (r.has_bandwidth) {
      std::fprintf(f, "%.6f,%.6f,%s\n", r.algbw_gbps, r.busbw_gbps, r.check);
    } else {
      std::fprintf(f, ",,%s\n", r.check);
    }
  }
  return out.close();
}

bool write_json(const std::string& path, const RunInfo& info, const std::vector<Row>& rows,
                bool all_ok, std::string* error) {
  OutFile out(path, error);
  FILE* f = out.get();
  if (f == nullptr) return false;
  const Options& o = *info.options;
  std::fprintf(f, "{\n  \"benchmark\": \"taiji-bench\",\n");
  std::fprintf(f, "  \"version\": %s,\n", json_string(info.version).c_str());
  std::fprintf(f, "  \"op\": \"%s\",\n", op_name(o.op));
  if (o.op != OpKind::kBarrier) std::fprintf(f, "  \"dtype\": \"%s\",\n", dtype_label(info));
  if (o.op == OpKind::kAllreduce) std::fprintf(f, "  \"redop\": \"%s\",\n", redop_name(o.redop));
  if (o.op == OpKind::kBroadcast) std::fprintf(f, "  \"root\": %d,\n", o.root);
  std::fprintf(f, "  \"world_size\": %d,\n  \"topology\": %s,\n", info.world,
               json_string(info.topology).c_str());
  std::fprintf(f, "  \"timeout_ms\": %" PRId64 ",\n  \"checked\": %s,\n  \"ok\": %s,\n",
               o.timeout_ms, checks_data(o) ? "true" : "false", all_ok ? "true" : "false");
  std::fprintf(f, "  \"rows\": [");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f,
                 "%s\n    {", i == 0 ? "" : ",");
    if (!r.topology.empty()) {
      std::fprintf(f, "\"topology\": %s, ", json_string(r.topology).c_str());
    }
    std::fprintf(f,
                 "\"size_bytes\": %" PRIu64 ", \"count\": %zu, \"iters\": %d, "
                 "\"warmup\": %d, \"time_us\": %.3f, \"min_us\": %.3f, \"max_us\": %.3f, ",
                 r.bytes, r.count, r.iters, r.warmup, r.time_us, r.min_us, r.max_us);
    if (r.has_bandwidth) {
      std::fprintf(f, "\"algbw_gbps\": %.6f, \"busbw_gbps\": %.6f, ", r.algbw_gbps,
                   r.busbw_gbps);
    } else {
      std::fprintf(f, "\"algbw_gbps\": null, \"busbw_gbps\": null, ");
    }
    if (std::strcmp(r.check, "-") == 0) {
      std::fprintf(f, "\"check\": null}");
    } else {
      std::fprintf(f, "\"check\": \"%s\"}", r.check);
    }
  }
  std::fprintf(f, "%s]\n}\n", rows.empty() ? "" : "\n  ");
  return out.close();
}

}  // namespace taiji_bench
