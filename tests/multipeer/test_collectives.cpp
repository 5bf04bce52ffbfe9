// The whole collective family over every built-in strategy, chosen per op, and over the
// automatic choice: allreduce, broadcast, allgather, reduce, gather, reduce_scatter,
// consensus and barrier, for world sizes 1..8, counts 0, 1, 7 and one count that spans
// several chunks and exceeds the eager limit, every root, in-place variants.
//
// Inputs are small integers stored as i32 or f32, so every partial sum is exact in both
// types and any reduction order gives the serial result: outputs are compared bitwise with
// the reference and across ranks. AVG divides exactly once (f32: correctly rounded
// quotient of the exact sum; i32: truncated), so it has a bitwise reference too.
//
// Each world size runs its whole sweep inside one run_peers call (starting peers is the
// expensive part); the ops of one strategy and count class are posted asynchronously and
// then waited for, so the sweep also runs many different collectives concurrently. A second
// sweep gives odd and even ranks different listen addresses, so that the host-aware
// strategies, which all collapse to simpler shapes on one host, build their two-host form.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collective_reference.h"
#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::Allreduce: return "allreduce";
    case Coll::Broadcast: return "broadcast";
    case Coll::Allgather: return "allgather";
    case Coll::Reduce: return "reduce";
    case Coll::Gather: return "gather";
    case Coll::ReduceScatter: return "reduce_scatter";
    case Coll::Consensus: return "consensus";
    case Coll::Barrier: return "barrier";
  }
  return "?";
}

const char* const kBuiltins[] = {"star",         "ring",
                                 "clique",       "tree",
                                 "binary_tree",  "binary_tree_star",
                                 "multi_binary_tree_star", "hierarchical"};

// Above the 64 KiB eager limit in both element types, and with TAIJI_CHUNK_BYTES=16K
// 18 chunks per block, so every pair of every multi-pair strategy carries some.
constexpr size_t kLargeCount = 70001;
constexpr const char* kChunkBytes = "16K";

// A batch (up to 27 ops of 70001-element blocks at n = 4, about 30 MB moved) is posted
// whole, so its last op's deadline runs from before the first one's data moved: 2-4 s
// under TSan on 2 cores.
constexpr int64_t kOpTimeoutMs = 60000;
constexpr int64_t kWaitMs = 90000;
// The deliberate length mismatch should be noticed by the ranks at once; a rank that only
// learns of it from its deadline reports ERR_TIMEOUT, which the check then names. The
// other ranks post it only after checking their own batch, which takes seconds under a
// sanitizer.
constexpr int64_t kMismatchTimeoutMs = 20000;

std::string describe(const Op& op) {
  std::string s = "'" + op.name + "' (" + coll_name(op.coll);
  if (op.coll != Coll::Barrier && op.coll != Coll::Consensus) {
    s += std::string(" ") + dtype_name(op.dtype);
  }
  if (op.coll == Coll::Allreduce || op.coll == Coll::Reduce || op.coll == Coll::ReduceScatter) {
    s += std::string(" ") + op_name(op.redop);
  }
  s += " count " + std::to_string(op.count);
  if (op.coll == Coll::Broadcast || op.coll == Coll::Reduce || op.coll == Coll::Gather) {
    s += " root " + std::to_string(op.root);
  }
  if (op.in_place) s += " in-place";
  s += std::string(" on ") + (op.topology ? op.topology : "automatic") + ")";
  return s;
}

// Whether rank holds a checked output for the op (rooted reductions: only the root).
bool has_output(const Op& op, int rank) {
  switch (op.coll) {
    case Coll::Reduce:
    case Coll::Gather: return rank == op.root;
    case Coll::Consensus:
    case Coll::Barrier: return false;
    default: return true;
  }
}

uint64_t want_for(const Op& op, int rank) {
  return op.want.size() == 1 ? op.want[0] : op.want[static_cast<size_t>(rank)];
}

int want_agree(const Op& op) { return op.odd_rank < 0 ? 1 : 0; }

class Planner {
 public:
  Planner(int n, const char* topology) : n_(n), topology_(topology) {}

  Op& add(Coll coll, taiji_dtype_t dtype, taiji_reduce_op_t redop, size_t count, int root = 0,
          bool in_place = false) {
    Op op;
    op.coll = coll;
    op.dtype = dtype;
    op.redop = redop;
    op.count = count;
    op.root = root;
    op.in_place = in_place;
    op.topology = topology_;
    op.name = std::string("c/") + (topology_ ? topology_ : "auto") + "/" + coll_name(coll) + "/" +
              std::to_string(ops_.size()) + "/" + std::to_string(count);
    op.salt = salt_of(op.name);
    ops_.push_back(std::move(op));
    return ops_.back();
  }

  std::vector<Op> take() {
    for (Op& op : ops_) {
      if (op.coll == Coll::Barrier || op.coll == Coll::Consensus) continue;
      const int distinct = op.coll == Coll::ReduceScatter ? n_ : 1;
      for (int r = 0; r < distinct; ++r) {
        auto out = expected_output(op, n_, r);
        op.want.push_back(digest(out.data(), out.size()));
      }
    }
    return std::move(ops_);
  }

 private:
  int n_;
  const char* topology_;
  std::vector<Op> ops_;
};

std::vector<int> roots_for(int n, bool every) {
  if (every) {
    std::vector<int> all(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) all[static_cast<size_t>(r)] = r;
    return all;
  }
  std::vector<int> some = {0, n / 2, n - 1};
  std::sort(some.begin(), some.end());
  some.erase(std::unique(some.begin(), some.end()), some.end());
  return some;
}

// Every collective on one strategy for the given counts, posted together.
struct Batch {
  std::vector<Op> ops;
  // A consensus to which one rank passes one byte fewer than the others; it runs alone
  // after the batch, so that its ERR_MISMATCH cannot be blamed on a neighbouring op.
  std::vector<Op> length_mismatch;
};

// `first`: the strategy's first batch, which also carries its barrier and length mismatch.
Batch plan_batch(int n, const char* topology, const std::vector<size_t>& counts, bool every_root, bool first) {
  Planner p(n, topology);
  const auto roots = roots_for(n, every_root);
  for (size_t count : counts) {
    p.add(Coll::Allreduce, TAIJI_I32, TAIJI_SUM, count);
    p.add(Coll::Allreduce, TAIJI_F32, TAIJI_SUM, count);
    p.add(Coll::Allreduce, TAIJI_I32, TAIJI_MAX, count);
    p.add(Coll::Allreduce, TAIJI_F32, TAIJI_MAX, count);
    p.add(Coll::Allreduce, TAIJI_I32, TAIJI_AVG, count);
    p.add(Coll::Allreduce, TAIJI_F32, TAIJI_AVG, count);
    p.add(Coll::Allreduce, TAIJI_F32, TAIJI_SUM, count, 0, true);
    p.add(Coll::Allgather, TAIJI_I32, TAIJI_SUM, count);
    p.add(Coll::Allgather, TAIJI_F32, TAIJI_SUM, count, 0, true);
    p.add(Coll::ReduceScatter, TAIJI_I32, TAIJI_SUM, count);
    p.add(Coll::ReduceScatter, TAIJI_F32, TAIJI_MAX, count);
    p.add(Coll::ReduceScatter, TAIJI_F32, TAIJI_AVG, count);
    const taiji_reduce_op_t redops[] = {TAIJI_SUM, TAIJI_MAX, TAIJI_AVG};
    for (int root : roots) {
      const taiji_dtype_t dtype = root % 2 ? TAIJI_F32 : TAIJI_I32;
      p.add(Coll::Broadcast, dtype, TAIJI_SUM, count, root);
      p.add(Coll::Reduce, dtype, redops[root % 3], count, root);
      p.add(Coll::Gather, dtype, TAIJI_SUM, count, root);
    }
    p.add(Coll::Reduce, TAIJI_F32, TAIJI_SUM, count, n - 1, true);
    p.add(Coll::Consensus, TAIJI_U8, TAIJI_SUM, count);
    if (n > 1 && count > 0) {
      p.add(Coll::Consensus, TAIJI_U8, TAIJI_SUM, count).odd_rank = static_cast<int>(count % static_cast<size_t>(n));
    }
  }
  if (first) p.add(Coll::Barrier, TAIJI_U8, TAIJI_SUM, 0);
  Batch batch;
  batch.ops = p.take();
  if (first && n > 1) {
    Planner q(n, topology);
    Op& op = q.add(Coll::Consensus, TAIJI_U8, TAIJI_SUM, 7);
    op.name += "/length";
    op.odd_rank = static_cast<int>(op.salt % static_cast<uint64_t>(n));
    batch.length_mismatch = q.take();
  }
  return batch;
}

// Ops whose output is the same on every rank.
bool shared_output(Coll c) {
  return c == Coll::Allreduce || c == Coll::Broadcast || c == Coll::Allgather || c == Coll::Consensus;
}

struct Sweep {
  int n = 1;
  std::vector<const char*> strategies;
  std::vector<size_t> small_counts = {0, 1, 7};  // with every root
  bool large = true;
  // false: the large count runs every root only for 1, 3 and 5 ranks, else three roots.
  bool every_root_large = false;
  // Listen addresses by rank parity, so host-aware strategies see two hosts.
  bool two_hosts = false;
};

// One op posted on one rank, with the buffers it owns until completion.
struct Posted {
  const Op* op = nullptr;
  std::unique_ptr<GuardedBuffer> send;
  std::unique_ptr<GuardedBuffer> recv;
  const void* send_ptr = nullptr;
  void* recv_ptr = nullptr;
  uint64_t send_digest = 0;
  size_t send_bytes = 0;
  int agree = -7;
  taiji_request_t* request = nullptr;
};

constexpr uint8_t kUntouched = 0x77;

std::unique_ptr<Posted> prepare(const Op& op, int n, int rank) {
  auto p = std::make_unique<Posted>();
  p->op = &op;
  const size_t es = elem_size(op);
  const size_t sbytes = send_elements(op, n) * es;
  const size_t rbytes = recv_elements(op, n) * es;
  switch (op.coll) {
    case Coll::Allreduce:
    case Coll::Reduce:
      if (op.in_place && (op.coll == Coll::Allreduce || rank == op.root)) {
        p->recv = std::make_unique<GuardedBuffer>(rbytes);
        fill_send(op, n, rank, p->recv->data());
        p->send_ptr = p->recv_ptr = p->recv->data();
        break;
      }
      p->send = std::make_unique<GuardedBuffer>(sbytes);
      fill_send(op, n, rank, p->send->data());
      p->send_ptr = p->send->data();
      // Receive buffers off the root: NULL on odd ranks (allowed), a buffer that must
      // stay untouched on even ones.
      if (op.coll == Coll::Allreduce || rank == op.root || rank % 2 == 0) {
        p->recv = std::make_unique<GuardedBuffer>(rbytes, kUntouched);
        p->recv_ptr = p->recv->data();
      }
      break;
    case Coll::Broadcast:
      p->recv = std::make_unique<GuardedBuffer>(rbytes, kUntouched);
      if (rank == op.root) fill_send(op, n, rank, p->recv->data());
      p->recv_ptr = p->recv->data();
      break;
    case Coll::Allgather:
      p->recv = std::make_unique<GuardedBuffer>(rbytes, kUntouched);
      p->recv_ptr = p->recv->data();
      if (op.in_place) {
        p->send_ptr = p->recv->data() + static_cast<size_t>(rank) * sbytes;
        fill_send(op, n, rank, p->recv->data() + static_cast<size_t>(rank) * sbytes);
      } else {
        p->send = std::make_unique<GuardedBuffer>(sbytes);
        fill_send(op, n, rank, p->send->data());
        p->send_ptr = p->send->data();
      }
      break;
    case Coll::Gather:
    case Coll::ReduceScatter:
    case Coll::Consensus:
      p->send = std::make_unique<GuardedBuffer>(sbytes);
      fill_send(op, n, rank, p->send->data());
      p->send_ptr = p->send->data();
      if (op.coll == Coll::ReduceScatter || (op.coll == Coll::Gather && (rank == op.root || rank % 2 == 0))) {
        p->recv = std::make_unique<GuardedBuffer>(rbytes, kUntouched);
        p->recv_ptr = p->recv->data();
      }
      break;
    case Coll::Barrier: break;
  }
  if (p->send) {
    p->send_bytes = sbytes;
    p->send_digest = digest(p->send->data(), sbytes);
  }
  return p;
}

taiji_status_t post(taiji_peer_t* peer, Posted& p, size_t consensus_bytes, const taiji_op_options_t* opt) {
  const Op& op = *p.op;
  const char* name = op.name.c_str();
  switch (op.coll) {
    case Coll::Allreduce:
      return taiji_allreduce(peer, name, p.send_ptr, p.recv_ptr, op.count, op.dtype, op.redop, opt, &p.request);
    case Coll::Broadcast:
      return taiji_broadcast(peer, name, p.recv_ptr, op.count, op.dtype, op.root, opt, &p.request);
    case Coll::Allgather:
      return taiji_allgather(peer, name, p.send_ptr, p.recv_ptr, op.count, op.dtype, opt, &p.request);
    case Coll::Reduce:
      return taiji_reduce(peer, name, p.send_ptr, p.recv_ptr, op.count, op.dtype, op.redop, op.root, opt,
                          &p.request);
    case Coll::Gather:
      return taiji_gather(peer, name, p.send_ptr, p.recv_ptr, op.count, op.dtype, op.root, opt, &p.request);
    case Coll::ReduceScatter:
      return taiji_reduce_scatter(peer, name, p.send_ptr, p.recv_ptr, op.count, op.dtype, op.redop, opt,
                                  &p.request);
    case Coll::Consensus:
      return taiji_consensus(peer, name, p.send_ptr, consensus_bytes, &p.agree, opt, &p.request);
    case Coll::Barrier: return taiji_barrier(peer, name, opt, &p.request);
  }
  return TAIJI_ERR_INTERNAL;
}

std::string first_difference(const uint8_t* got, const std::vector<uint8_t>& want, const Op& op) {
  const size_t es = elem_size(op);
  for (size_t i = 0; i < want.size(); i += es) {
    if (std::memcmp(got + i, want.data() + i, es) == 0) continue;
    std::string g;
    std::string w;
    if (op.dtype == TAIJI_F32 && op.coll != Coll::Consensus) {
      float a;
      float b;
      std::memcpy(&a, got + i, 4);
      std::memcpy(&b, want.data() + i, 4);
      g = std::to_string(a);
      w = std::to_string(b);
    } else {
      int32_t a;
      int32_t b;
      std::memcpy(&a, got + i, 4);
      std::memcpy(&b, want.data() + i, 4);
      g = std::to_string(a);
      w = std::to_string(b);
    }
    size_t wrong = 0;
    for (size_t j = i; j < want.size(); j += es) wrong += std::memcmp(got + j, want.data() + j, es) != 0;
    return "element " + std::to_string(i / es) + " of " + std::to_string(want.size() / es) + " is " + g +
           ", expected " + w + " (" + std::to_string(wrong) + " wrong elements)";
  }
  return "digest differs but no element does";
}

// Digests of the strategies as this peer builds them (host-aware ones with its hosts).
std::map<std::string, uint64_t> peer_digests(taiji_peer_t* peer, Failures& failures, int rank) {
  std::map<std::string, uint64_t> out;
  for (const char* name : kBuiltins) {
    taiji_topology_t* t = nullptr;
    taiji_status_t s = taiji_topology_from_text(peer, name, 0, &t);
    if (failures.expect_status(rank, std::string("topology_from_text(peer, ") + name + ")", s, TAIJI_OK)) {
      out[name] = taiji_topology_digest(t);
    }
    taiji_topology_destroy(t);
  }
  return out;
}

// Per op and rank: the output digest this rank saw (0 where it has none), so that ranks can
// be compared with each other after the run, not only with the reference.
using Observed = std::vector<std::vector<uint64_t>>;

void check_posted(Posted& p, taiji_status_t s, int n, int rank, const std::map<std::string, uint64_t>& digests,
                  Failures& failures, Observed& observed, size_t index) {
  const Op& op = *p.op;
  const std::string what = describe(op);
  if (!failures.expect_status(rank, what, s, TAIJI_OK)) return;
  const uint64_t used = taiji_request_topology_digest(p.request);
  if (op.topology) {
    auto it = digests.find(op.topology);
    if (it != digests.end() && used != it->second) {
      failures.add(rank, what + ": ran on topology digest " + std::to_string(used) + ", the peer's '" +
                             op.topology + "' has " + std::to_string(it->second));
    }
  } else {
    failures.expect(rank, used == digests.at("tree") || used == digests.at("ring"),
                    what + ": the automatic choice ran on a topology that is neither tree nor ring");
  }
  if (p.send && !p.send->guard_intact()) failures.add(rank, what + ": wrote past the send buffer");
  if (p.send && digest(p.send->data(), p.send_bytes) != p.send_digest) {
    failures.add(rank, what + ": the send buffer changed");
  }
  if (p.recv && !p.recv->guard_intact()) failures.add(rank, what + ": wrote past the receive buffer");
  if (op.coll == Coll::Consensus) {
    observed[index][static_cast<size_t>(rank)] = static_cast<uint64_t>(p.agree);
    failures.expect(rank, p.agree == want_agree(op),
                    what + ": agree is " + std::to_string(p.agree) + ", expected " + std::to_string(want_agree(op)));
    return;
  }
  if (!p.recv) return;
  const size_t rbytes = recv_elements(op, n) * elem_size(op);
  if (!has_output(op, rank)) {
    bool untouched = std::all_of(p.recv->data(), p.recv->data() + rbytes, [](uint8_t b) { return b == kUntouched; });
    failures.expect(rank, untouched, what + ": a non-root's receive buffer was written");
    return;
  }
  const uint64_t got = digest(p.recv->data(), rbytes);
  observed[index][static_cast<size_t>(rank)] = got;
  if (got != want_for(op, rank)) {
    failures.add(rank, what + ": " + first_difference(p.recv->data(), expected_output(op, n, rank), op));
  }
}

void run_sweep(const Sweep& sw) {
  const int n = sw.n;
  // Batches in posting order; every rank posts the same batches.
  std::vector<Batch> batches;
  for (const char* topology : sw.strategies) {
    batches.push_back(plan_batch(n, topology, sw.small_counts, true, true));
    if (sw.large) {
      bool every = sw.every_root_large || n == 1 || n == 3 || n == 5;
      batches.push_back(plan_batch(n, topology, {kLargeCount}, every, false));
    }
  }
  std::vector<Observed> observed;
  for (const auto& b : batches) {
    observed.emplace_back(b.ops.size(), std::vector<uint64_t>(static_cast<size_t>(n), 0));
  }

  Failures failures;
  std::atomic<bool> abandoned{false};
  PeerOptions options;
  options.timeout_ms = kOpTimeoutMs;
  if (sw.two_hosts) {
    options.configure = [](int rank, taiji_config_t& cfg) { cfg.listen_host = rank % 2 ? "127.0.0.2" : "127.0.0.1"; };
  }
  EnvOverride chunk("TAIJI_CHUNK_BYTES", kChunkBytes);
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    const auto digests = peer_digests(peer, failures, rank);
    if (digests.size() != std::size(kBuiltins)) return;
    if (sw.two_hosts && n >= 3) {
      // Every rank on its own host gives a ring of n pairs; two hosts give two pairs.
      taiji_topology_t* plain = nullptr;
      if (taiji_topology_from_text(nullptr, "hierarchical", n, &plain) == TAIJI_OK) {
        failures.expect(rank, taiji_topology_digest(plain) != digests.at("hierarchical"),
                        "hierarchical ignores the two listen hosts");
      } else {
        failures.add(rank, std::string("topology_from_text(NULL, hierarchical): ") + taiji_peer_last_error(nullptr));
      }
      taiji_topology_destroy(plain);
    }
    for (size_t b = 0; b < batches.size(); ++b) {
      const std::vector<Op>& batch = batches[b].ops;
      if (abandoned.load()) {
        if (rank == 0) failures.add(rank, "stopped before batch " + batch.front().name + " after an earlier failure");
        break;
      }
      std::vector<std::unique_ptr<Posted>> posted;
      posted.reserve(batch.size());
      for (const Op& op : batch) {
        posted.push_back(prepare(op, n, rank));
        taiji_op_options_t opt = op_options(kOpTimeoutMs, op.topology);
        taiji_status_t s = post(peer, *posted.back(), op.count, &opt);
        if (!failures.expect_status(rank, "posting " + describe(op), s, TAIJI_OK)) {
          failures.add(rank, std::string("  last error: ") + taiji_peer_last_error(peer));
          abandoned.store(true);
          posted.pop_back();
        }
      }
      for (auto& p : posted) {
        taiji_status_t s = wait_bounded(peer, p->request, kWaitMs, failures, rank, describe(*p->op));
        if (s != TAIJI_OK) abandoned.store(true);
        check_posted(*p, s, n, rank, digests, failures, observed[b], static_cast<size_t>(p->op - batch.data()));
        taiji_request_free(p->request);
      }
      for (const Op& op : batches[b].length_mismatch) {
        if (abandoned.load()) break;
        auto p = prepare(op, n, rank);
        const size_t bytes = rank == op.odd_rank ? op.count - 1 : op.count;
        const std::string what = describe(op) + " with rank " + std::to_string(op.odd_rank) + " passing " +
                                 std::to_string(op.count - 1) + " bytes";
        taiji_op_options_t opt = op_options(kMismatchTimeoutMs, op.topology);
        taiji_status_t s = post(peer, *p, bytes, &opt);
        if (failures.expect_status(rank, "posting " + what, s, TAIJI_OK)) {
          s = wait_bounded(peer, p->request, kWaitMs, failures, rank, what);
          failures.expect_status(rank, what, s, TAIJI_ERR_MISMATCH);
        }
        taiji_request_free(p->request);
      }
    }
    taiji_op_options_t end = op_options(30000);
    failures.expect_status(rank, "end-of-sweep barrier", taiji_barrier(peer, "sweep/end", &end, nullptr), TAIJI_OK);
  }, options);
  failures.add_all(lines);
  for (size_t b = 0; b < batches.size(); ++b) {
    for (size_t i = 0; i < batches[b].ops.size(); ++i) {
      const Op& op = batches[b].ops[i];
      if (!shared_output(op.coll)) continue;
      const auto& got = observed[b][i];
      if (std::any_of(got.begin(), got.end(), [&](uint64_t d) { return d != got[0]; })) {
        std::string seen;
        for (uint64_t d : got) seen += " " + std::to_string(d);
        failures.add(-1, describe(op) + ": ranks hold different results (digests" + seen + ")");
      }
    }
  }
  check_no_failures(failures);
}

std::vector<const char*> every_strategy() {
  std::vector<const char*> all(std::begin(kBuiltins), std::end(kBuiltins));
  all.push_back(nullptr);
  return all;
}

}  // namespace

TEST_CASE("collectives: every strategy, collective, root and count", "[collectives]") {
  const int n = GENERATE(filter([](int k) { return in_quick_range(k); }, range(1, 9)));
  CAPTURE(n);
  Sweep sw;
  sw.n = n;
  sw.strategies = every_strategy();
  sw.every_root_large = true;
  run_sweep(sw);
}

TEST_CASE("collectives: host-aware strategies over two listen hosts", "[collectives]") {
  const int n = GENERATE(filter([](int k) { return in_quick_range(k); }, range(2, 9)));
  CAPTURE(n);
  Sweep sw;
  sw.n = n;
  // tree is binary_tree_star under another name, and the automatic choice uses tree.
  sw.strategies = {"tree", "binary_tree_star", "multi_binary_tree_star", "hierarchical", nullptr};
  sw.two_hosts = true;
  // Every root for the small counts, three for the large one: the first sweep already runs
  // every root of the large count, and this one only adds the two-host shapes.
  run_sweep(sw);
}

TEST_CASE("collectives: reduce_scatter with its output inside its input", "[collectives]") {
  // recv == send (MPI_IN_PLACE's layout) and recv == send + rank * count (NCCL's). The
  // result is written once every chunk is final, which can come while a chunk this rank
  // only passes on is still queued to go out straight from the input: an input that
  // overlaps the output must have been copied away first. Large blocks over a ring keep
  // such chunks queued long enough for the race to show.
  constexpr int n = 3;
  constexpr size_t kCount = size_t{1} << 20;  // i32 per block: 4 MiB
  const char* shm = GENERATE("off", "auto");
  const bool nccl_layout = GENERATE(false, true);
  CAPTURE(shm, nccl_layout);
  EnvOverride transport("TAIJI_SHM", shm);
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    auto value = [](int r, size_t i) { return static_cast<int32_t>((r + 1) * 7 + static_cast<int>(i % 1000)); };
    // Ten rounds showed the race in every run of the old code; the sanitizer passes
    // (TAIJI_TEST_QUICK), slower by far, run four.
    const int rounds = in_quick_range(5) ? 10 : 4;
    for (int round = 0; round < rounds; ++round) {
      std::vector<int32_t> buf(kCount * n);
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = value(rank, i);
      int32_t* out = nccl_layout ? buf.data() + static_cast<size_t>(rank) * kCount : buf.data();
      taiji_op_options_t opt = op_options(30000);
      opt.topology = "ring";
      const std::string name = "rs.inplace." + std::to_string(round);
      if (!failures.expect_status(rank, name,
                                  taiji_reduce_scatter(peer, name.c_str(), buf.data(), out, kCount, TAIJI_I32,
                                                       TAIJI_SUM, &opt, nullptr),
                                  TAIJI_OK)) {
        return;
      }
      for (size_t i = 0; i < kCount; ++i) {
        const size_t at = static_cast<size_t>(rank) * kCount + i;
        int32_t want = 0;
        for (int r = 0; r < n; ++r) want += value(r, at);
        if (out[i] != want) {
          failures.add(rank, name + " element " + std::to_string(i) + " is " + std::to_string(out[i]) +
                                 ", want " + std::to_string(want));
          break;
        }
      }
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("collectives: elements of 1 2 and 8 bytes through every collective", "[collectives]") {
  // The sweep above moves I32 and F32 only; other element sizes meet chunk and block
  // boundaries at other byte offsets (4 KiB chunks split the large count many times).
  // Under the sanitizers (TAIJI_TEST_QUICK) three ranks only.
  const int n = GENERATE(filter([](int k) { return in_quick_range(k, 3); }, values({3, 4})));
  const char* topology = GENERATE(as<const char*>{}, "", "ring");
  CAPTURE(n, topology);
  EnvOverride chunk("TAIJI_CHUNK_BYTES", "4K");
  const taiji_dtype_t dtypes[] = {TAIJI_I8, TAIJI_U8, TAIJI_F16, TAIJI_BF16, TAIJI_F64, TAIJI_I64};
  const size_t counts[] = {0, 1, 7, 70001};
  const int root = 1;
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options(30000);
    if (*topology != '\0') opt.topology = topology;
    for (taiji_dtype_t dtype : dtypes) {
      for (size_t count : counts) {
        ReduceCase full;  // every rank's whole input: n blocks of count elements
        full.dtype = dtype;
        full.op = TAIJI_SUM;
        full.count = count * static_cast<size_t>(n);
        full.salt = salt_of(std::string("sizes/") + dtype_name(dtype) + "/" + std::to_string(count));
        const size_t es = dtype_size(dtype);
        const size_t block = count * es;
        auto input_of = [&](int r) {
          std::vector<uint8_t> in(full.count * es);
          fill_input(full, r, in.data());
          return in;
        };
        const std::vector<uint8_t> in = input_of(rank);
        const std::string tag = std::string(dtype_name(dtype)) + "/" + std::to_string(count);
        auto check = [&](const std::string& what, taiji_status_t s) {
          return failures.expect_status(rank, what + " " + tag, s, TAIJI_OK);
        };

        std::vector<uint8_t> sum(in.size());
        if (!check("allreduce", taiji_allreduce(peer, ("sz.ar/" + tag).c_str(), in.data(), sum.data(), full.count,
                                                dtype, TAIJI_SUM, &opt, nullptr))) {
          return;
        }
        if (std::string e = check_reduce(full, n, sum.data()); !e.empty()) failures.add(rank, "allreduce " + tag + ":" + e);

        // reduce_scatter: this rank's block, checked in the allreduce's place.
        std::vector<uint8_t> mine(block);
        if (check("reduce_scatter", taiji_reduce_scatter(peer, ("sz.rs/" + tag).c_str(), in.data(), mine.data(), count,
                                                         dtype, TAIJI_SUM, &opt, nullptr))) {
          std::vector<uint8_t> spliced = sum;
          if (block > 0) std::memcpy(spliced.data() + static_cast<size_t>(rank) * block, mine.data(), block);
          if (std::string e = check_reduce(full, n, spliced.data()); !e.empty()) {
            failures.add(rank, "reduce_scatter " + tag + ":" + e);
          }
        }

        std::vector<uint8_t> reduced(in.size());
        if (check("reduce", taiji_reduce(peer, ("sz.red/" + tag).c_str(), in.data(), reduced.data(), full.count,
                                         dtype, TAIJI_SUM, root, &opt, nullptr)) &&
            rank == root) {
          if (std::string e = check_reduce(full, n, reduced.data()); !e.empty()) failures.add(rank, "reduce " + tag + ":" + e);
        }

        std::vector<uint8_t> bcast = rank == root ? in : std::vector<uint8_t>(in.size(), 0xAB);
        if (check("broadcast", taiji_broadcast(peer, ("sz.bc/" + tag).c_str(), bcast.data(), full.count, dtype, root,
                                               &opt, nullptr))) {
          failures.expect(rank, bcast == input_of(root), "broadcast " + tag + ": not the root's bytes");
        }

        // allgather and gather of each rank's first block.
        std::vector<uint8_t> want(block * static_cast<size_t>(n));
        for (int q = 0; q < n; ++q) {
          if (block > 0) std::memcpy(want.data() + static_cast<size_t>(q) * block, input_of(q).data(), block);
        }
        std::vector<uint8_t> all(want.size(), 0xAB);
        if (check("allgather", taiji_allgather(peer, ("sz.ag/" + tag).c_str(), in.data(), all.data(), count, dtype,
                                               &opt, nullptr))) {
          failures.expect(rank, all == want, "allgather " + tag + ": wrong bytes");
        }
        std::vector<uint8_t> gathered(want.size(), 0xAB);
        if (check("gather", taiji_gather(peer, ("sz.ga/" + tag).c_str(), in.data(), gathered.data(), count, dtype,
                                         root, &opt, nullptr)) &&
            rank == root) {
          failures.expect(rank, gathered == want, "gather " + tag + ": wrong bytes");
        }
      }
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}
