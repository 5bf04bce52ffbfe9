#include <algorithm>
#include <cinttypes>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>

#include "bench.h"

namespace taiji_bench {
namespace {

// f16 and bf16 are reduced with rounding to the storage type after every step, so their
// limits are the largest runs of exactly representable integers (2^11 and 2^8).
// f64's is capped far below 2^53 because inputs are generated through uint64_t anyway.
constexpr DtypeInfo kDtypes[] = {
    {TAIJI_F32, "f32", 4, 1ull << 24},      {TAIJI_F64, "f64", 8, 1ull << 40},
    {TAIJI_F16, "f16", 2, 1ull << 11},      {TAIJI_BF16, "bf16", 2, 1ull << 8},
    {TAIJI_I8, "i8", 1, 127},               {TAIJI_U8, "u8", 1, 255},
    {TAIJI_I32, "i32", 4, 0x7fffffffull},   {TAIJI_U32, "u32", 4, 0xffffffffull},
    {TAIJI_I64, "i64", 8, 1ull << 40},      {TAIJI_U64, "u64", 8, 1ull << 40},
};

struct Alias {
  const char* alias;
  const char* name;
};
constexpr Alias kDtypeAliases[] = {
    {"float", "f32"},    {"float32", "f32"}, {"double", "f64"},  {"float64", "f64"},
    {"half", "f16"},     {"float16", "f16"}, {"bfloat16", "bf16"}, {"int8", "i8"},
    {"uint8", "u8"},     {"int32", "i32"},   {"int", "i32"},     {"uint32", "u32"},
    {"int64", "i64"},    {"uint64", "u64"},
};

const DtypeInfo* find_dtype(std::string_view name) {
  for (const Alias& a : kDtypeAliases) {
    if (name == a.alias) name = a.name;
  }
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

bool parse_redop(std::string_view s, taiji_reduce_op_t* out) {
  static constexpr taiji_reduce_op_t kOps[] = {TAIJI_SUM, TAIJI_PROD, TAIJI_MIN, TAIJI_MAX,
                                               TAIJI_AVG};
  for (taiji_reduce_op_t op : kOps) {
    if (s == redop_name(op)) {
      *out = op;
      return true;
    }
  }
  return false;
}

bool parse_u64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

// "4", "64M", "1G", "512KiB", "2mb": suffixes are powers of 1024, case-insensitive.
bool parse_size(std::string_view s, uint64_t* out) {
  size_t digits = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
  uint64_t v = 0;
  if (!parse_u64(s.substr(0, digits), &v)) return false;
  std::string suffix;
  for (char c : s.substr(digits)) {
    suffix += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  }
  unsigned shift = 0;
  if (suffix == "k" || suffix == "kb" || suffix == "kib") shift = 10;
  else if (suffix == "m" || suffix == "mb" || suffix == "mib") shift = 20;
  else if (suffix == "g" || suffix == "gb" || suffix == "gib") shift = 30;
  else if (!suffix.empty() && suffix != "b") return false;
  if (shift != 0 && v > (std::numeric_limits<uint64_t>::max() >> shift)) return false;
  *out = v << shift;
  return true;
}

bool is_builtin_topology(std::string_view name) {
  const auto& names = builtin_topologies();
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string builtin_list() {
  std::string out;
  for (std::string_view n : builtin_topologies()) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

// "all" or comma-separated built-in names without repeats; false on anything else.
bool parse_topology_list(std::string_view s, std::vector<std::string>* out) {
  std::vector<std::string> names;
  if (s == "all") {
    for (std::string_view n : builtin_topologies()) names.emplace_back(n);
    *out = names;
    return true;
  }
  size_t start = 0;
  while (true) {
    size_t comma = s.find(',', start);
    std::string_view item =
        s.substr(start, comma == std::string_view::npos ? comma : comma - start);
    if (!is_builtin_topology(item) ||
        std::find(names.begin(), names.end(), item) != names.end()) {
      return false;
    }
    names.emplace_back(item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  *out = names;
  return true;
}

bool parse_int(std::string_view s, int64_t lo, int64_t hi, int64_t* out) {
  uint64_t v = 0;
  if (!parse_u64(s, &v) || v > static_cast<uint64_t>(hi) ||
      static_cast<int64_t>(v) < lo) {
    return false;
  }
  *out = static_cast<int64_t>(v);
  return true;
}

}  // namespace

const std::vector<std::string_view>& builtin_topologies() {
  static const std::vector<std::string_view> names = {
      "star",        "ring",         "clique", "tree", "binary_tree", "binary_tree_star",
      "multi_binary_tree_star", "hierarchical"};
  return names;
}

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
  }
  return "?";
}

const char* redop_name(taiji_reduce_op_t op) {
  switch (op) {
    case TAIJI_SUM: return "sum";
    case TAIJI_PROD: return "prod";
    case TAIJI_MIN: return "min";
    case TAIJI_MAX: return "max";
    case TAIJI_AVG: return "avg";
  }
  return "?";
}

std::string format_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  unsigned u = 0;
  uint64_t whole = bytes;
  while (u + 1 < std::size(kUnits) && whole >= 1024 && whole % 1024 == 0) {
    whole /= 1024;
    ++u;
  }
  return std::to_string(whole) + " " + kUnits[u];
}

void print_usage() {
  std::printf(
      "Usage: taiji-bench [options]\n"
      "Times taiji collectives over a range of message sizes. Every process of the job\n"
      "runs it (e.g. `taiji-run -np 4 taiji-bench`); rank 0 prints the results.\n"
      "\n"
      "  --op OP            allreduce (default), broadcast or barrier\n"
      "  -b, --min-bytes N  smallest message size (default 4)\n"
      "  -e, --max-bytes N  largest message size (default 64M)\n"
      "  -f, --step-factor F  multiply the size by F (an integer >= 2) between rows\n"
      "                     (default 2)\n"
      "  --dtype T          f32 (default), f64, f16, bf16, i8, u8, i32, u32, i64, u64\n"
      "  --redop OP         sum (default), prod, min, max, avg (allreduce only)\n"
      "  -n, --iters N      timed iterations per size (default: adaptive, 5..1000,\n"
      "                     aiming at about 0.3 s per size)\n"
      "  -w, --warmup N     untimed iterations per size (default 5, 2 above 1 MiB)\n"
      "  --topology T       run every op on built-in topology T: star, ring, clique,\n"
      "                     tree, binary_tree, binary_tree_star, multi_binary_tree_star,\n"
      "                     hierarchical (default: the library's choice)\n"
      "  --sweep-topologies [LIST]  run the size sweep once per topology, one after the\n"
      "                     other, and print one table with a column per topology and\n"
      "                     the winner per size; LIST is comma-separated names or all\n"
      "                     (the default: every built-in)\n"
      "  --swap-at I        one size (--max-bytes), --iters iterations (default 20): after\n"
      "                     I iterations every peer calls taiji_set_topology(--swap-to);\n"
      "                     prints the time, bandwidth and topology digest of each\n"
      "                     iteration. --topology then sets the starting topology.\n"
      "  --swap-to T        the built-in topology to swap to (with --swap-at)\n"
      "  --root R           broadcast root (default 0)\n"
      "  --csv FILE         also write the results as CSV (rank 0)\n"
      "  --json FILE        also write the results as JSON (rank 0)\n"
      "  --timeout-ms T     deadline of each operation (default 120000)\n"
      "  --check, --no-check  verify results (default: on)\n"
      "  --metrics M        the library's op metrics: on, off, or both: iterations\n"
      "                     alternate off and on, and a table compares the medians\n"
      "                     (default: as TAIJI_METRICS says)\n"
      "  --fusion-test NxSIZE  post N allreduces of SIZE bytes (distinct names) at once,\n"
      "                     then wait for all; times each batch (--iters, default 20;\n"
      "                     --warmup, default 3) and checks every result\n"
      "  --fusion M         with --fusion-test: TAIJI_FUSION off, on, or both (default:\n"
      "                     both, batches alternating between two peers, with the ratio)\n"
      "  --group G          with --fusion-test: on posts each batch in one group\n"
      "                     (taiji_group_start/end), off one op at a time (default: off)\n"
      "  -h, --help         show this help\n"
      "\n"
      "Sizes take K, M and G suffixes (powers of 1024). Values may also be given as\n"
      "--option=value. time(us) is the median over iterations of the slowest peer's\n"
      "time; busbw follows nccl-tests (allreduce: algbw * 2(n-1)/n, broadcast: algbw).\n"
      "With --swap-at every iteration's result is checked, outside the timed region.\n"
      "Exit status: 0 success, 1 a result check failed, 2 usage or library error.\n");
}

ParseResult parse_options(int argc, char** argv, Options* out, std::string* error) {
  Options o;
  o.dtype = find_dtype("f32");
  bool redop_given = false;
  bool fusion_mode_given = false;  // --fusion or --group
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view key = arg;
    std::optional<std::string_view> inline_value;
    if (arg.starts_with("--")) {
      if (size_t eq = arg.find('='); eq != std::string_view::npos) {
        key = arg.substr(0, eq);
        inline_value = arg.substr(eq + 1);
      }
    }
    auto fail = [&](const std::string& why) {
      *error = why;
      return ParseResult::kError;
    };
    if (key == "-h" || key == "--help") return ParseResult::kHelp;
    if (key == "--sweep-topologies") {
      // The list is optional: the benchmark takes no other arguments than options, so
      // a following argument that is not an option is the list.
      std::vector<std::string> list;
      std::optional<std::string_view> given = inline_value;
      if (!given && i + 1 < argc && argv[i + 1][0] != '-') given = argv[++i];
      if (!given) {
        parse_topology_list("all", &list);
      } else if (!parse_topology_list(*given, &list)) {
        return fail("bad value '" + std::string(*given) +
                    "' for --sweep-topologies: expected all or distinct names from " +
                    builtin_list() + ", comma-separated");
      }
      o.sweep_topologies = list;
      continue;
    }
    if (key == "--check" || key == "--no-check") {
      if (inline_value) return fail(std::string(key) + " takes no value");
      o.check = key == "--check";
      continue;
    }
    static constexpr std::string_view kValued[] = {
        "--op",    "-b",      "--min-bytes", "-e",     "--max-bytes",  "-f",
        "--step-factor", "--dtype", "--redop", "-n", "--iters", "-w", "--warmup",
        "--topology", "--root", "--csv", "--json", "--timeout-ms", "--swap-at", "--swap-to",
        "--metrics", "--fusion-test", "--fusion", "--group"};
    if (std::find(std::begin(kValued), std::end(kValued), key) == std::end(kValued)) {
      return fail("unknown option " + std::string(arg) + " (see --help)");
    }
    std::string_view value;
    if (inline_value) {
      value = *inline_value;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return fail("option " + std::string(arg) + " needs a value (see --help)");
    }
    auto bad = [&](const char* expected) {
      return fail("bad value '" + std::string(value) + "' for " + std::string(key) + ": " +
                  expected);
    };
    int64_t n = 0;
    if (key == "--op") {
      if (value == "allreduce") o.op = OpKind::kAllreduce;
      else if (value == "broadcast") o.op = OpKind::kBroadcast;
      else if (value == "barrier") o.op = OpKind::kBarrier;
      else return bad("expected allreduce, broadcast or barrier");
    } else if (key == "-b" || key == "--min-bytes") {
      if (!parse_size(value, &o.min_bytes)) return bad("expected a size such as 4, 8K, 64M");
    } else if (key == "-e" || key == "--max-bytes") {
      if (!parse_size(value, &o.max_bytes)) return bad("expected a size such as 4, 8K, 64M");
    } else if (key == "-f" || key == "--step-factor") {
      if (!parse_int(value, 2, 1 << 20, &n)) return bad("expected an integer >= 2");
      o.step_factor = static_cast<uint64_t>(n);
    } else if (key == "--dtype") {
      o.dtype = find_dtype(value);
      if (o.dtype == nullptr) return bad("expected f32, f64, f16, bf16, i8, u8, i32, u32, i64 or u64");
    } else if (key == "--redop") {
      if (!parse_redop(value, &o.redop)) return bad("expected sum, prod, min, max or avg");
      redop_given = true;
    } else if (key == "-n" || key == "--iters") {
      if (!parse_int(value, 1, 1000000000, &n)) return bad("expected a positive integer");
      o.iters = static_cast<int>(n);
    } else if (key == "-w" || key == "--warmup") {
      if (!parse_int(value, 0, 1000000000, &n)) return bad("expected a non-negative integer");
      o.warmup = static_cast<int>(n);
    } else if (key == "--topology") {
      if (!is_builtin_topology(value)) return fail("bad value '" + std::string(value) +
                                                   "' for --topology: expected one of " +
                                                   builtin_list());
      o.topology = value;
    } else if (key == "--swap-at") {
      if (!parse_int(value, 0, 1000000000, &n)) return bad("expected a non-negative integer");
      o.swap_at = static_cast<int>(n);
    } else if (key == "--swap-to") {
      if (!is_builtin_topology(value)) return fail("bad value '" + std::string(value) +
                                                  "' for --swap-to: expected one of " +
                                                  builtin_list());
      o.swap_to = value;
    } else if (key == "--root") {
      if (!parse_int(value, 0, std::numeric_limits<int>::max(), &n)) {
        return bad("expected a non-negative integer");
      }
      o.root = static_cast<int>(n);
    } else if (key == "--csv") {
      if (value.empty()) return bad("expected a file name");
      o.csv_path = value;
    } else if (key == "--json") {
      if (value.empty()) return bad("expected a file name");
      o.json_path = value;
    } else if (key == "--metrics") {
      if (value == "on") o.metrics = MetricsMode::kOn;
      else if (value == "off") o.metrics = MetricsMode::kOff;
      else if (value == "both") o.metrics = MetricsMode::kBoth;
      else return bad("expected on, off or both");
    } else if (key == "--fusion-test") {
      size_t x = value.find('x');
      if (x == std::string_view::npos || !parse_int(value.substr(0, x), 1, 100000, &n) ||
          !parse_size(value.substr(x + 1), &o.fusion_op_bytes) || o.fusion_op_bytes == 0) {
        return bad("expected NxSIZE such as 100x4K");
      }
      o.fusion_ops = static_cast<int>(n);
    } else if (key == "--fusion") {
      fusion_mode_given = true;
      if (value == "on") o.fusion = FusionMode::kOn;
      else if (value == "off") o.fusion = FusionMode::kOff;
      else if (value == "both") o.fusion = FusionMode::kBoth;
      else return bad("expected on, off or both");
    } else if (key == "--group") {
      fusion_mode_given = true;
      if (value == "on") o.fusion_group = true;
      else if (value == "off") o.fusion_group = false;
      else return bad("expected on or off");
    } else if (key == "--timeout-ms") {
      if (!parse_int(value, 1, std::numeric_limits<int64_t>::max(), &n)) {
        return bad("expected a positive number of milliseconds");
      }
      o.timeout_ms = n;
    }
  }
  if (o.min_bytes > o.max_bytes) {
    *error = "--min-bytes " + std::to_string(o.min_bytes) + " is above --max-bytes " +
             std::to_string(o.max_bytes);
    return ParseResult::kError;
  }
  auto reject = [&](const std::string& why) {
    *error = why;
    return ParseResult::kError;
  };
  if (o.swap_at.has_value() != !o.swap_to.empty()) {
    return reject("--swap-at and --swap-to go together");
  }
  if (!o.sweep_topologies.empty() && !o.topology.empty()) {
    return reject("--sweep-topologies chooses the topologies itself; drop --topology");
  }
  if (!o.sweep_topologies.empty() && o.swap_at) {
    return reject("--sweep-topologies and --swap-at are separate runs");
  }
  if (o.swap_at && *o.swap_at >= o.iters.value_or(kDefaultSwapIters)) {
    return reject("--swap-at " + std::to_string(*o.swap_at) +
                  " must be below the number of iterations (" +
                  std::to_string(o.iters.value_or(kDefaultSwapIters)) + ", see --iters)");
  }
  if (o.metrics == MetricsMode::kBoth && (o.swap_at || !o.sweep_topologies.empty())) {
    return reject("--metrics both compares plain size sweeps; drop --swap-at and --sweep-topologies");
  }
  if (o.fusion_ops > 0 && (o.op != OpKind::kAllreduce || o.swap_at || !o.sweep_topologies.empty())) {
    return reject("--fusion-test times allreduces alone; drop --op, --swap-at and --sweep-topologies");
  }
  if (o.fusion_ops > 0 && o.fusion_op_bytes < o.dtype->size) {
    return reject("--fusion-test op size is below one " + std::string(o.dtype->name) + " element");
  }
  if (o.fusion_ops > 0 && o.fusion_op_bytes % o.dtype->size != 0) {
    return reject("--fusion-test op size is not a whole number of " + std::string(o.dtype->name) + " elements");
  }
  if (o.fusion_ops > 0 && (!o.csv_path.empty() || !o.json_path.empty() || !o.topology.empty() ||
                           o.metrics != MetricsMode::kDefault)) {
    return reject("--fusion-test prints its own table on the automatic topology; drop --csv, --json, "
                  "--topology and --metrics");
  }
  if (o.fusion_ops == 0 && fusion_mode_given) {
    return reject("--fusion and --group apply to --fusion-test only");
  }
  // A sweep needs one whole element at the largest size (a swap run times that size);
  // sizes are rounded down to whole elements, and an explicit 0 runs empty ops.
  if (o.op != OpKind::kBarrier && o.fusion_ops == 0 && o.min_bytes > 0 && o.max_bytes < o.dtype->size) {
    return reject("--max-bytes " + std::to_string(o.max_bytes) + " is below one " +
                  std::string(o.dtype->name) + " element (" + std::to_string(o.dtype->size) + " bytes)");
  }
  if (redop_given && o.op != OpKind::kAllreduce) {
    *error = std::string("--redop applies to allreduce only, not ") + op_name(o.op);
    return ParseResult::kError;
  }
  *out = o;
  return ParseResult::kRun;
}

}  // namespace taiji_bench
