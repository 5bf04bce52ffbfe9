// parse_topology on any text, and the round trips its contract promises.
//
// Input: byte 0 picks the rank count n = 1 + b0 % 64; byte 1 the host map (0: none, every
// rank on its own host; 1..127: blocks of b1 ranks per host; 128: one host; 129..255:
// ranks dealt round-robin over b1 - 128 hosts); the rest is the topology text.
//
// A parsed strategy must be valid; printing it and parsing the print must give the same
// graphs, digest and print; an explicit text must already be its one spelling; every graph
// rebuilt from its edges (graph_from_edges) must come back unchanged. A rejection must be
// InvalidArgument with a one-line printable message. Any difference aborts: it is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "topology/graph.h"
#include "topology/text.h"

namespace {

using taiji::Graph;
using taiji::Strategy;

constexpr int kMaxRanks = 64;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_topology_text: %s\n", what);
    std::abort();
  }
}

std::vector<int> host_map(int n, uint8_t mode) {
  std::vector<int> hosts;
  if (mode == 0) return hosts;
  for (int r = 0; r < n; ++r) {
    if (mode < 128) hosts.push_back(r / mode);
    else if (mode == 128) hosts.push_back(0);
    else hosts.push_back(r % (mode - 128));
  }
  return hosts;
}

std::string_view trimmed(std::string_view t) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!t.empty() && space(t.front())) t.remove_prefix(1);
  while (!t.empty() && space(t.back())) t.remove_suffix(1);
  return t;
}

bool printable_line(const std::string& s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c >= 0x7f) return false;
  }
  return true;
}

bool same_graphs(const Strategy& a, const Strategy& b) {
  if (a.pairs.size() != b.pairs.size()) return false;
  for (size_t i = 0; i < a.pairs.size(); ++i) {
    if (a.pairs[i].reduce.parents() != b.pairs[i].reduce.parents() ||
        a.pairs[i].broadcast.parents() != b.pairs[i].broadcast.parents()) {
      return false;
    }
  }
  return true;
}

// Edges listed from the highest rank down, so the order differs from the parent array's.
void check_edges_round_trip(const Graph& g, int n) {
  std::vector<std::pair<int, int>> edges;
  for (int r = n - 1; r >= 0; --r) {
    if (g.parent(r) != -1) edges.emplace_back(r, g.parent(r));
  }
  auto rebuilt = taiji::graph_from_edges(n, edges);
  check(rebuilt.is_ok(), "graph_from_edges rejects the edges of a valid graph");
  check(rebuilt.value().parents() == g.parents(), "graph_from_edges changed a graph");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int n = 1 + data[0] % kMaxRanks;
  const std::vector<int> hosts = host_map(n, data[1]);
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  auto parsed = taiji::parse_topology(text, n, hosts);
  if (!parsed.is_ok()) {
    const taiji::Status& st = parsed.status();
    check(st.code() == taiji::Code::InvalidArgument, "a rejection is not InvalidArgument");
    check(!st.message().empty() && printable_line(st.message()),
          "a rejection's message is empty or not printable one-line text");
    return 0;
  }
  const Strategy& s = parsed.value();
  check(taiji::validate_strategy(s, n).is_ok(), "parse_topology returned an invalid strategy");

  const std::string printed = taiji::to_text(s);
  if (trimmed(text).starts_with("pairs=")) {
    check(printed == trimmed(text), "an explicit text is not its own print");
  }
  auto reparsed = taiji::parse_topology(printed, n, hosts);
  check(reparsed.is_ok(), "the print of a parsed strategy does not parse");
  check(same_graphs(s, reparsed.value()), "parse(print(s)) has other graphs than s");
  check(taiji::topology_digest(s) == taiji::topology_digest(reparsed.value()),
        "parse(print(s)) has another digest than s");
  check(taiji::to_text(reparsed.value()) == printed, "print(parse(print(s))) != print(s)");

  for (const taiji::GraphPair& p : s.pairs) {
    check_edges_round_trip(p.reduce, n);
    check_edges_round_trip(p.broadcast, n);
  }
  return 0;
}
