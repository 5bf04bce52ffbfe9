#include "topology/text.h"

#include <algorithm>
#include <climits>
#include <string>
#include <utility>

#include "topology/strategies.h"

namespace taiji {

namespace {

Status invalid(std::string message) { return {Code::InvalidArgument, std::move(message)}; }

std::string str(size_t v) { return std::to_string(v); }

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' ||
         c == '-';
}

void append_parents(std::string* out, const Graph& g) {
  for (int r = 0; r < g.size(); ++r) {
    if (r) *out += ',';
    *out += std::to_string(g.parent(r));
  }
}

// One pass over the explicit form. Every function returns false after recording the first
// error; offsets are reported in the caller's untrimmed text.
class Parser {
 public:
  Parser(std::string_view text, size_t base, int n) : t_(text), base_(base), n_(n) {}

  Result<Strategy> parse() {
    Strategy s{"custom", {}};
    if (!explicit_form(&s)) return error_;
    if (Status st = validate_strategy(s, n_); !st.is_ok()) return st;
    return s;
  }

 private:
  bool explicit_form(Strategy* s) {
    int pairs = 0;
    int n = 0;
    if (!literal("pairs=") || !count(&pairs, "the pair count")) return false;
    if (pairs == 0) return fail("pairs=0: a strategy needs at least one pair");
    if (static_cast<size_t>(pairs) > max_strategy_pairs(n_)) {
      return fail("pairs=" + str(pairs) + ": at most " + str(max_strategy_pairs(n_)) +
                  " pairs allowed for " + str(n_) + " ranks");
    }
    const size_t n_offset = offset() + 3;
    if (!literal(";n=") || !count(&n, "the rank count")) return false;
    if (n != n_) {
      return fail("n=" + str(n) + " at offset " + str(n_offset) + ": expected " + str(n_) +
                  " ranks, got " + str(n));
    }
    for (int i = 0; i < pairs; ++i) {
      if (at_end()) return fail("expected " + str(pairs) + " pairs, got " + str(i));
      const std::string where = "pair " + str(i);
      std::vector<int> up;
      std::vector<int> down;
      if (!literal(";R") || !index(i) || !literal(":") ||
          !parents(&up, where + " reduce graph", "',' or '|'", '|') || !literal("|B") ||
          !index(i) || !literal(":") ||
          !parents(&down, where + " broadcast graph", "',' or ';'", ';')) {
        return false;
      }
      s->pairs.push_back({Graph(std::move(up)), Graph(std::move(down))});
    }
    if (!at_end()) return unexpected("end of text after " + str(pairs) + " pairs");
    return true;
  }

  bool index(int want) {
    const size_t at = offset();
    int got = 0;
    if (!count(&got, "the pair index " + str(want))) return false;
    if (got != want) {
      return fail("pair index " + str(got) + " at offset " + str(at) + ", expected " + str(want));
    }
    return true;
  }

  // Ranks 0..n-1 in order; the list must end at `terminator` or the end of the text.
  bool parents(std::vector<int>* out, const std::string& where, const std::string& expected,
               char terminator) {
    for (;;) {
      const size_t at = offset();
      int p = 0;
      if (!parent(&p)) return false;
      if (out->size() == static_cast<size_t>(n_)) {
        return fail(where + ": expected " + str(n_) + " ranks, got more (extra parent at offset " +
                    str(at) + ")");
      }
      out->push_back(p);
      if (at_end() || peek() != ',') break;
      ++pos_;
    }
    if (!at_end() && peek() != terminator) return unexpected(expected);
    if (out->size() != static_cast<size_t>(n_)) {
      return fail(where + ": expected " + str(n_) + " ranks, got " + str(out->size()));
    }
    return true;
  }

  bool parent(int* out) {
    if (!at_end() && peek() == '-') {
      const size_t at = offset();
      ++pos_;
      int v = 0;
      if (!count(&v, "a digit")) return false;
      if (v != 1) {
        return fail("parent -" + str(v) + " at offset " + str(at) +
                    ": only -1 (the root) may be negative");
      }
      *out = -1;
      return true;
    }
    return count(out, "a rank or -1");
  }

  // A non-negative decimal that fits an int; one spelling per value.
  bool count(int* out, const std::string& what) {
    if (at_end() || !is_digit(peek())) return unexpected(what);
    const size_t at = offset();
    if (peek() == '0' && pos_ + 1 < t_.size() && is_digit(t_[pos_ + 1])) {
      return fail("leading zero in number at offset " + str(at));
    }
    long long v = 0;
    while (!at_end() && is_digit(peek())) {
      v = v * 10 + (peek() - '0');
      if (v > INT_MAX) return fail("number at offset " + str(at) + " too large");
      ++pos_;
    }
    *out = static_cast<int>(v);
    return true;
  }

  bool literal(std::string_view lit) {
    for (char c : lit) {
      if (at_end() || peek() != c) return unexpected("'" + std::string(lit) + "'");
      ++pos_;
    }
    return true;
  }

  bool unexpected(const std::string& expected) {
    if (at_end()) {
      return fail("unexpected end of text at offset " + str(offset()) + " (expected " +
                  expected + ")");
    }
    return fail("unexpected character '" + printable(t_.substr(pos_, 1)) + "' at offset " +
                str(offset()) + " (expected " + expected + ")");
  }

  bool fail(std::string message) {
    error_ = invalid(std::move(message));
    return false;
  }

  bool at_end() const { return pos_ >= t_.size(); }
  char peek() const { return t_[pos_]; }
  size_t offset() const { return base_ + pos_; }

  std::string_view t_;
  size_t base_;
  int n_;
  size_t pos_ = 0;
  Status error_;
};

}  // namespace

size_t max_strategy_pairs(int n) {
  return std::max(kMinPairLimit, static_cast<size_t>(std::max(n, 0)));
}

std::string to_text(const Strategy& s) {
  const int n = s.pairs.empty() ? 0 : s.pairs[0].reduce.size();
  std::string out = "pairs=" + str(s.pairs.size()) + ";n=" + std::to_string(n);
  for (size_t i = 0; i < s.pairs.size(); ++i) {
    out += ";R" + str(i) + ':';
    append_parents(&out, s.pairs[i].reduce);
    out += "|B" + str(i) + ':';
    append_parents(&out, s.pairs[i].broadcast);
  }
  return out;
}

Result<Strategy> parse_topology(std::string_view text, int n, const std::vector<int>& host_of) {
  if (text.size() > kMaxTopologyTextBytes) {
    return invalid("topology text is " + str(text.size()) + " bytes, more than the " +
                   str(kMaxTopologyTextBytes) + " allowed");
  }
  if (n < 1) return invalid("a topology needs at least 1 rank, got " + std::to_string(n));
  const std::string_view body = topology_text_body(text);
  const auto begin = static_cast<size_t>(body.data() - text.data());
  if (body.empty()) return invalid("empty topology text (expected a strategy name or 'pairs=')");
  if (body.starts_with("pairs=")) return Parser(body, begin, n).parse();
  for (size_t i = 0; i < body.size(); ++i) {
    if (!is_name_char(body[i])) {
      return invalid("unexpected character '" + printable(body.substr(i, 1)) + "' at offset " +
                     str(begin + i) + " (expected a strategy name or 'pairs=')");
    }
  }
  return make_strategy(body, n, host_of);
}

std::string_view topology_text_body(std::string_view text) {
  size_t begin = 0;
  size_t end = text.size();
  while (begin < end && is_space(text[begin])) ++begin;
  while (end > begin && is_space(text[end - 1])) --end;
  return text.substr(begin, end - begin);
}

Result<Graph> graph_from_edges(int n, const std::vector<std::pair<int, int>>& edges) {
  if (n < 1) return invalid("a graph needs at least 1 rank, got " + std::to_string(n));
  const auto edge_name = [&](size_t i) {
    return "edge " + str(i) + " (" + std::to_string(edges[i].first) + " -> " +
           std::to_string(edges[i].second) + ")";
  };
  for (size_t i = 0; i < edges.size(); ++i) {
    const auto [child, parent] = edges[i];
    for (int r : {child, parent}) {
      if (r < 0 || r >= n) {
        return invalid(edge_name(i) + ": rank " + std::to_string(r) + " out of range for " +
                       std::to_string(n) + " ranks");
      }
    }
    if (child == parent) return invalid(edge_name(i) + ": rank is its own parent");
  }
  // Sorted by child, then by position, so a duplicate is reported with its first two edges.
  // Nothing here is sized by n: a huge n with few edges must not allocate n entries.
  std::vector<std::pair<int, size_t>> by_child;
  by_child.reserve(edges.size());
  for (size_t i = 0; i < edges.size(); ++i) by_child.emplace_back(edges[i].first, i);
  std::sort(by_child.begin(), by_child.end());
  for (size_t j = 1; j < by_child.size(); ++j) {
    if (by_child[j].first == by_child[j - 1].first) {
      return invalid("duplicate child: rank " + std::to_string(by_child[j].first) +
                     " has two parents, in " + edge_name(by_child[j - 1].second) + " and " +
                     edge_name(by_child[j].second));
    }
  }
  // Distinct in-range children: there are edges.size() of them, at most n.
  if (edges.size() == static_cast<size_t>(n)) {
    return invalid("no root: all " + std::to_string(n) + " ranks are somebody's child");
  }
  if (edges.size() + 1 < static_cast<size_t>(n)) {
    constexpr size_t kShown = 8;
    const size_t missing = static_cast<size_t>(n) - edges.size();
    std::string list;
    size_t shown = 0;
    size_t j = 0;
    for (int r = 0; r < n && shown < kShown; ++r) {
      if (j < by_child.size() && by_child[j].first == r) {
        ++j;
        continue;
      }
      list += (shown++ ? ", " : "") + std::to_string(r);
    }
    if (missing > shown) list += ", ... (" + str(missing) + " in all)";
    return invalid("missing edges: " + str(missing) + " ranks are nobody's child (" + list +
                   ") but a tree over " + std::to_string(n) + " ranks has one root");
  }
  std::vector<int> parent(static_cast<size_t>(n), -1);
  for (const auto& [child, p] : edges) parent[child] = p;
  Graph g(std::move(parent));
  if (Status s = validate_graph(g, n); !s.is_ok()) return s;
  return g;
}

uint64_t topology_digest(const Strategy& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  const auto feed = [&h](int64_t value) {
    const uint32_t u = static_cast<uint32_t>(value);
    for (int shift = 0; shift < 32; shift += 8) {
      h ^= (u >> shift) & 0xffU;
      h *= 0x100000001b3ULL;
    }
  };
  const auto feed_graph = [&feed](const Graph& g) {
    feed(g.size());
    for (int p : g.parents()) feed(p);
  };
  feed(s.pairs.empty() ? 0 : s.pairs[0].reduce.size());
  feed(static_cast<int64_t>(s.pairs.size()));
  for (const GraphPair& p : s.pairs) {
    feed_graph(p.reduce);
    feed_graph(p.broadcast);
  }
  return h;
}

Status validate_strategy(const Strategy& s, int n) {
  if (s.pairs.empty()) return invalid("strategy '" + printable(s.name) + "' has no pairs");
  if (s.pairs.size() > max_strategy_pairs(n)) {
    return invalid("strategy '" + printable(s.name) + "' has " + str(s.pairs.size()) +
                   " pairs, more than the " + str(max_strategy_pairs(n)) + " allowed for " +
                   std::to_string(n) + " ranks");
  }
  for (size_t i = 0; i < s.pairs.size(); ++i) {
    if (Status st = validate_pair(s.pairs[i], n); !st.is_ok()) {
      return invalid("pair " + str(i) + " " + st.message());
    }
  }
  return Status::ok();
}

std::string printable(std::string_view s, size_t max_chars) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t shown = std::min(s.size(), max_chars);
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  if (shown < s.size()) out += "... (" + str(s.size()) + " bytes)";
  return out;
}

}  // namespace taiji
