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

}  // namespace

void print_header(const RunInfo& info) {
  const Options& o = *info.options;
  std::printf("# taiji-bench: op %s", op_name(o.op));
  if (o.op != OpKind::kBarrier) std::printf("  dtype %s", dtype_label(info));
  if (o.op == OpKind::kAllreduce) std::printf("  redop %s", redop_name(o.redop));
  if (o.op == OpKind::kBroadcast) std::printf("  root %d", o.root);
  std::printf("  world %d  topology %s  taiji %s\n", info.world, info.topology.c_str(),
              info.version.c_str());
  if (o.op != OpKind::kBarrier) {
    std::printf("# sizes %s .. %s, x%" PRIu64, format_bytes(o.min_bytes).c_str(),
                format_bytes(o.max_bytes).c_str(), o.step_factor);
  } else {
    std::printf("# no payload");
  }
  std::string iters = o.iters ? std::to_string(*o.iters) : "adaptive";
  std::string warmup = o.warmup ? std::to_string(*o.warmup) : "auto";
  std::printf("  iters %s  warmup %s  timeout %" PRId64 " ms  check %s\n", iters.c_str(),
              warmup.c_str(), o.timeout_ms, checks_data(o) ? "on" : "off");
  std::printf("# time: median over iterations of the slowest peer's time per iteration\n");
  std::printf("#\n");
  std::printf("# %12s %12s %6s %12s %12s %12s %6s\n", "size(B)", "count", "dtype", "time(us)",
              "algbw(GB/s)", "busbw(GB/s)", "check");
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
    if (!r.has_bandwidth) continue;
    sum += r.busbw_gbps;
    ++n;
  }
  std::printf("#\n");
  if (n > 0) std::printf("# avg busbw: %.3f GB/s over %d sizes\n", sum / n, n);
  if (checks_data(*info.options)) {
    std::printf("# check: %s\n", all_ok ? "all ok" : "FAILED (see rows marked FAIL)");
  }
  std::fflush(stdout);
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
                 info.world, info.topology.c_str(), r.bytes, r.count, r.iters, r.warmup,
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
                 "%s\n    {\"size_bytes\": %" PRIu64 ", \"count\": %zu, \"iters\": %d, "
                 "\"warmup\": %d, \"time_us\": %.3f, \"min_us\": %.3f, \"max_us\": %.3f, ",
                 i == 0 ? "" : ",", r.bytes, r.count, r.iters, r.warmup, r.time_us, r.min_us,
                 r.max_us);
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
