// Strategies as text (configuration, logs, agreement between peers), edge lists, digests.
//
// Text grammar. A topology text is either a built-in name or the explicit form, with
// optional ASCII whitespace (space, tab, CR, LF) before and after; nothing else may vary, so
// every explicit strategy has exactly one spelling and to_text(parse(t)) == t.
//
//   topology := ws* (name | explicit) ws*
//   name     := one of strategy_names()                  e.g. "ring", "hierarchical"
//   explicit := "pairs=" count ";n=" count (";" pair){count}
//   pair     := "R" index ":" parents "|" "B" index ":" parents
//   parents  := parent ("," parent){n-1}                  parent[r] for r = 0..n-1
//   parent   := "-1" | count                              -1 marks the root
//   count    := "0" | [1-9][0-9]*                         no sign, no leading zeros, <= INT_MAX
//   index    := count, equal to the pair's position (0-based)
//
// The pair count is 1..max_strategy_pairs(n) and the n field must equal the caller's n.
//
// R<i> is pair i's reduce graph (data flows to its root), B<i> its broadcast graph (data
// flows from its root). For example the ring over 3 ranks is
//   pairs=3;n=3;R0:-1,2,0|B0:-1,0,1;R1:1,-1,0|B1:2,-1,1;R2:1,2,-1|B2:2,0,-1
// The strategy's name is not part of the explicit form: it is a label, not topology (and
// topology_digest ignores it too); a parsed explicit strategy is named "custom".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "topology/graph.h"

namespace taiji {

// Longer texts are rejected before any parsing.
inline constexpr size_t kMaxTopologyTextBytes = size_t{1} << 20;
// A strategy may have at most max(kMinPairLimit, n) pairs: every built-in has at most n, and
// the cap bounds what a text can make us build.
inline constexpr size_t kMinPairLimit = 1024;
size_t max_strategy_pairs(int n);

// The explicit form above, whatever the strategy (invalid graphs are written as they are,
// so that the text shows the fault).
std::string to_text(const Strategy& s);

// A built-in name (built with host_of, see strategies.h) or the explicit form for n ranks,
// fully validated (validate_strategy). Errors are InvalidArgument naming the fault: the
// offset of a syntax error ("unexpected character 'x' at offset 17"), a wrong rank count
// ("pair 0 reduce graph: expected 4 ranks, got 3") or an invalid graph ("pair 2 reduce
// graph: cycle through ranks 1 -> 2 -> 1"). Any byte string is safe input: for the
// explicit form the work and memory are bounded by the text length, itself capped at
// kMaxTopologyTextBytes; a built-in name is built for n ranks (up to n^2 entries for
// ring, clique and hierarchical), so callers that only check a name look it up in strategy_names().
Result<Strategy> parse_topology(std::string_view text, int n, const std::vector<int>& host_of);
// The text without the whitespace the grammar allows around it: a built-in name, the
// explicit form, or something parse_topology refuses.
std::string_view topology_text_body(std::string_view text);

// A graph from (child, parent) edges: every rank but one is a child exactly once, and the
// rank that is nobody's child is the root. Errors name the edge or the ranks at fault.
Result<Graph> graph_from_edges(int n, const std::vector<std::pair<int, int>>& child_parent_edges);

// FNV-1a 64 over n, the pair count and every parent array (each value as 4 bytes, little
// endian), so equal graphs give equal digests on every machine, whatever the names.
uint64_t topology_digest(const Strategy& s);

// At least one pair, at most max_strategy_pairs(n), every pair valid (validate_pair); the
// message starts with the pair at fault ("pair 2 reduce graph: ...").
Status validate_strategy(const Strategy& s, int n);

// Text from outside, made safe to quote in a message: bytes outside printable ASCII (and
// the backslash and quote) become \xHH, and only the first max_chars bytes are kept.
std::string printable(std::string_view s, size_t max_chars = 64);

}  // namespace taiji
