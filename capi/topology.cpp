// The C ABI for topologies: creation from parent arrays, edge lists or text, and the
// run-time swap.
#include <taiji/taiji.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "handles.h"
#include "topology/selection.h"
#include "topology/text.h"

using namespace taiji_capi;

namespace {

// Up to 4096^2 = 16 Mi parents per graph set for ring or clique: some 2 GB and 10-15 s to
// build (a parent and a child list per rank of every graph).
constexpr int kMaxBuiltinRanksWithoutPeer = 4096;

taiji_status_t refuse(const std::string& why, taiji_topology_t** out) {
  init_error = why;
  if (out != nullptr) *out = nullptr;
  return TAIJI_ERR_INVALID_ARGUMENT;
}

// Shared by the array and edge-list forms: graph(p, reduce?) builds one graph or fails.
template <typename MakeGraph>
taiji_status_t build(int size, int pairs, MakeGraph make_graph, taiji_topology_t** out) {
  if (out == nullptr) return refuse("topology output pointer is NULL", nullptr);
  *out = nullptr;
  if (size < 1 || pairs < 1) return refuse("size and pairs must be at least 1", out);
  if (static_cast<size_t>(pairs) > taiji::max_strategy_pairs(size)) {
    return refuse("too many pairs: " + std::to_string(pairs), out);
  }
  try {
    taiji::Strategy s;
    s.name = "custom";
    for (int p = 0; p < pairs; ++p) {
      auto reduce = make_graph(p, true);
      if (!reduce.is_ok()) return refuse("pair " + std::to_string(p) + " reduce graph: " + reduce.status().message(), out);
      auto bcast = make_graph(p, false);
      if (!bcast.is_ok()) return refuse("pair " + std::to_string(p) + " broadcast graph: " + bcast.status().message(), out);
      s.pairs.push_back({std::move(reduce.value()), std::move(bcast.value())});
    }
    taiji::Status valid = taiji::validate_strategy(s, size);
    if (!valid.is_ok()) return refuse(valid.message(), out);
    *out = new taiji_topology{taiji::bind_custom(std::move(s)), size};
    return TAIJI_OK;
  } catch (const std::bad_alloc&) {
    init_error = "out of memory";
    return TAIJI_ERR_NO_MEMORY;
  } catch (const std::exception& e) {
    init_error = e.what();
    return TAIJI_ERR_INTERNAL;
  }
}

}  // namespace

extern "C" {

taiji_status_t taiji_topology_from_parents(int size, int pairs, const int* reduce_parents,
                                           const int* broadcast_parents, taiji_topology_t** topology) {
  if (reduce_parents == nullptr || broadcast_parents == nullptr) {
    return refuse("parent arrays must not be NULL", topology);
  }
  return build(size, pairs, [&](int p, bool reduce) -> taiji::Result<taiji::Graph> {
    const int* base = (reduce ? reduce_parents : broadcast_parents) + static_cast<size_t>(p) * size;
    taiji::Graph g(std::vector<int>(base, base + size));
    taiji::Status s = taiji::validate_graph(g, size);
    if (!s.is_ok()) return s;
    return g;
  }, topology);
}

taiji_status_t taiji_topology_from_edges(int size, int pairs, const int* reduce_edges,
                                         const int* broadcast_edges, taiji_topology_t** topology) {
  if (reduce_edges == nullptr || broadcast_edges == nullptr) {
    return refuse("edge arrays must not be NULL", topology);
  }
  return build(size, pairs, [&](int p, bool reduce) -> taiji::Result<taiji::Graph> {
    size_t per_graph = 2 * static_cast<size_t>(size - 1);
    const int* base = (reduce ? reduce_edges : broadcast_edges) + static_cast<size_t>(p) * per_graph;
    std::vector<std::pair<int, int>> edges;
    for (int e = 0; e < size - 1; ++e) edges.emplace_back(base[2 * e], base[2 * e + 1]);
    return taiji::graph_from_edges(size, edges);
  }, topology);
}

taiji_status_t taiji_topology_from_text(const taiji_peer_t* peer, const char* text, int size,
                                        taiji_topology_t** topology) {
  if (topology == nullptr) return refuse("topology output pointer is NULL", nullptr);
  *topology = nullptr;
  if (text == nullptr) return refuse("text is NULL", topology);
  try {
    if (peer != nullptr) {
      if (size != 0 && size != peer->impl->size()) {
        return refuse("size " + std::to_string(size) + " differs from the peer's world size " +
                          std::to_string(peer->impl->size()), topology);
      }
      auto bound = peer->impl->resolve_topology(text);
      if (!bound.is_ok()) return refuse(bound.status().message(), topology);
      *topology = new taiji_topology{bound.value(), peer->impl->size()};
      return TAIJI_OK;
    }
    if (size < 1) return refuse("size must be at least 1 without a peer", topology);
    // A built-in is built for `size` ranks, up to size^2 parents; a peer's size is that of
    // a real job, but here nothing else bounds it. (An explicit text is bounded by its length.)
    if (size > kMaxBuiltinRanksWithoutPeer && taiji::strategy_id(taiji::topology_text_body(text)) != 0) {
      return refuse("size " + std::to_string(size) + ": without a peer, built-in topologies are made for at most " +
                        std::to_string(kMaxBuiltinRanksWithoutPeer) + " ranks",
                    topology);
    }
    auto parsed = taiji::parse_topology(text, size, {});
    if (!parsed.is_ok()) return refuse(parsed.status().message(), topology);
    // Without a peer the host map is unknown, so even a built-in name is bound by its
    // graphs (digest), never by a built-in id that a peer may build differently.
    *topology = new taiji_topology{taiji::bind_custom(std::move(parsed.value())), size};
    return TAIJI_OK;
  } catch (const std::bad_alloc&) {
    init_error = "out of memory";
    return TAIJI_ERR_NO_MEMORY;
  } catch (const std::exception& e) {
    init_error = e.what();
    return TAIJI_ERR_INTERNAL;
  }
}

size_t taiji_topology_text(const taiji_topology_t* topology, char* buf, size_t len) {
  if (topology == nullptr) {
    if (buf != nullptr && len > 0) buf[0] = '\0';
    return 0;
  }
  std::string text;
  try {
    text = taiji::to_text(*topology->bound.strategy);
  } catch (...) {
    // Out of memory for the text (a large topology's is tens of MB): nothing to give.
    if (buf != nullptr && len > 0) buf[0] = '\0';
    return 0;
  }
  if (buf != nullptr && len > 0) {
    size_t n = std::min(len - 1, text.size());
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return text.size();
}

uint64_t taiji_topology_digest(const taiji_topology_t* topology) {
  return topology ? topology->bound.digest : 0;
}

int taiji_topology_size(const taiji_topology_t* topology) { return topology ? topology->size : -1; }

void taiji_topology_destroy(taiji_topology_t* topology) { delete topology; }

taiji_status_t taiji_set_topology(taiji_peer_t* peer, const taiji_topology_t* topology,
                                  const taiji_op_options_t* options, taiji_request_t** request) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(peer, [&]() -> taiji_status_t {
    if (topology != nullptr && topology->size != peer->impl->size()) {
      return invalid(peer, "topology is for a different number of ranks");
    }
    taiji::PostArgs args;
    taiji_status_t s = apply_options(peer, options, request == nullptr, &args);
    if (s != TAIJI_OK) return s;
    taiji_op_options_t opt;
    read_options(options, &opt);  // checked by apply_options
    if (opt.grad_stats != nullptr) return invalid(peer, "options.grad_stats is for allreduce only");
    taiji::BoundStrategy proposed = topology ? topology->bound : taiji::BoundStrategy{};
    return post_and_finish(peer, request, [&] {
      return peer->impl->set_topology(proposed, args.timeout_ms, std::move(args.callback));
    });
  });
}

}  // extern "C"
