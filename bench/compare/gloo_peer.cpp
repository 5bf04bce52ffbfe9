// taiji-compare-gloo: Gloo's allreduce algorithms (ring, ring_chunked, halving_doubling,
// bcube), broadcast (one_to_all) and barriers (all_to_one, all_to_all) over Gloo's TCP
// transport, timed the way taiji-bench times taiji (see peer_common.h). One line per size
// and algorithm; the driver picks the best. Every rank runs it with its own --rank:
//   taiji-compare-gloo --rank R --world N --store DIR [--host ADDR] [--algos ring,bcube]
// Rendezvous goes through Gloo's file store in DIR (a fresh, shared directory per job).
// Gloo's algorithms reduce in place, so the timed loop runs on data that sums to zero.
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <exception>
#include <functional>
#include <memory>
#include <sstream>

#include "peer_common.h"

namespace {

using compare::Op;
using compare::Options;
using Ctx = std::shared_ptr<gloo::Context>;

std::unique_ptr<gloo::Algorithm> make_algorithm(const Ctx& ctx, Op op, const std::string& algo,
                                                float* p, size_t count) {
  const int n = static_cast<int>(count);
  const std::vector<float*> ptrs{p};
  if (op == Op::kBroadcast) {
    return std::make_unique<gloo::BroadcastOneToAll<float>>(ctx, ptrs, count, 0, 0);
  }
  if (op == Op::kBarrier) {
    if (algo == "all_to_one") return std::make_unique<gloo::BarrierAllToOne>(ctx, 0);
    return std::make_unique<gloo::BarrierAllToAll>(ctx);
  }
  if (algo == "ring") return std::make_unique<gloo::AllreduceRing<float>>(ctx, ptrs, n);
  if (algo == "ring_chunked") {
    return std::make_unique<gloo::AllreduceRingChunked<float>>(ctx, ptrs, n);
  }
  if (algo == "halving_doubling") {
    return std::make_unique<gloo::AllreduceHalvingDoubling<float>>(ctx, ptrs, n);
  }
  return std::make_unique<gloo::AllreduceBcube<float>>(ctx, ptrs, n);
}

std::vector<std::string> algorithms(const Options& o) {
  std::vector<std::string> all;
  if (o.op == Op::kAllreduce) all = {"ring", "ring_chunked", "halving_doubling", "bcube"};
  if (o.op == Op::kBroadcast) all = {"one_to_all"};
  if (o.op == Op::kBarrier) all = {"all_to_one", "all_to_all"};
  if (o.algos.empty()) return all;
  std::vector<std::string> out;
  std::stringstream in(o.algos);
  for (std::string a; std::getline(in, a, ',');) {
    if (std::find(all.begin(), all.end(), a) == all.end()) {
      throw std::invalid_argument("unknown algorithm for " + std::string(compare::op_name(o.op)) +
                                  ": " + a);
    }
    out.push_back(a);
  }
  return out;
}

// Elementwise reduction of doubles across ranks, for the timings and the verdict.
void reduce(const Ctx& ctx, std::vector<double>* v, const gloo::ReductionFunction<double>* fn) {
  gloo::AllreduceRing<double>(ctx, {v->data()}, static_cast<int>(v->size()), fn).run();
}

struct Result {
  std::vector<double> times;
  double cpu = 0;
  bool ok = true;
};

Result run_size(const Ctx& ctx, const Options& o, const std::string& algo, uint64_t bytes,
                int iters) {
  const int rank = ctx->rank;
  const int world = ctx->size;
  const size_t count = bytes / 4;
  std::vector<float> buf(std::max<size_t>(count, 1));
  auto alg = make_algorithm(ctx, o.op, algo, buf.data(), count);
  if (o.op == Op::kAllreduce) compare::fill_zero_sum(buf.data(), count, rank, world);
  if (o.op == Op::kBroadcast) compare::fill_broadcast(buf.data(), count, rank == 0, 0);

  Result r;
  r.times.resize(static_cast<size_t>(iters));
  for (int i = 0; i < o.warmup; ++i) alg->run();
  gloo::BarrierAllToAll(ctx).run();
  const double cpu0 = compare::cpu_seconds();
  double refill_cpu = 0;
  for (size_t i = 0; i < r.times.size(); ++i) {
    if (i > 0 && i + 1 == r.times.size()) {
      // The last timed op gets inputs whose sum is not zero (untimed, its CPU not
      // counted), so the check below reads what a timed op computed.
      const double c0 = compare::cpu_seconds();
      if (o.op == Op::kAllreduce) compare::fill_allreduce(buf.data(), count, rank, 2);
      if (o.op == Op::kBroadcast) compare::fill_broadcast(buf.data(), count, rank == 0, 0);
      refill_cpu += compare::cpu_seconds() - c0;
    }
    const double start = compare::now_seconds();
    alg->run();
    r.times[i] = compare::now_seconds() - start;
  }
  std::vector<double> cpu{compare::cpu_seconds() - cpu0 - refill_cpu};

  std::vector<double> pass{1};
  if (o.op == Op::kAllreduce) {
    const bool last_refilled = r.times.size() > 1;
    if (last_refilled ? !compare::verify_allreduce(buf.data(), count, world, 2)
                      : !compare::verify_zero(buf.data(), count)) {
      pass[0] = 0;
    }
    compare::fill_allreduce(buf.data(), count, rank, 1);
    alg->run();
    if (!compare::verify_allreduce(buf.data(), count, world, 1)) pass[0] = 0;
  } else if (o.op == Op::kBroadcast) {
    if (!compare::verify_broadcast(buf.data(), count, 0)) pass[0] = 0;
    compare::fill_broadcast(buf.data(), count, rank == 0, 1);
    alg->run();
    if (!compare::verify_broadcast(buf.data(), count, 1)) pass[0] = 0;
  }
  if (pass[0] == 0) {
    std::fprintf(stderr, "taiji-compare-gloo: rank %d: wrong %s (%s) result at %llu bytes\n", rank,
                 compare::op_name(o.op), algo.c_str(), static_cast<unsigned long long>(bytes));
  }
  reduce(ctx, &r.times, gloo::ReductionFunction<double>::max);
  reduce(ctx, &cpu, gloo::ReductionFunction<double>::sum);
  reduce(ctx, &pass, gloo::ReductionFunction<double>::min);
  r.cpu = cpu[0];
  r.ok = pass[0] == 1;
  return r;
}

int run(const Options& o) {
  gloo::transport::tcp::attr attr;
  attr.hostname = o.host;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(o.store);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world);
  ctx->setTimeout(std::chrono::seconds(120));
  ctx->connectFullMesh(store, dev);
  const Ctx base = ctx;
  bool all_ok = true;
  const std::vector<std::string> algos = algorithms(o);
  for (uint64_t bytes : compare::sizes(o)) {
    const int iters = compare::iterations(o, bytes);
    for (const std::string& algo : algos) {
      Result r = run_size(base, o, algo, bytes, iters);
      all_ok = all_ok && r.ok;
      if (o.rank == 0) {
        compare::print_row(o, "gloo", algo.c_str(), o.world, bytes, iters, r.times, r.cpu, r.ok);
      }
    }
  }
  // Gloo sends asynchronously and its barrier does not wait for them, so a rank leaving
  // right after the last barrier can close a connection another rank is still reading
  // ("Connection closed by peer"). Leave only once every rank has finished all its ops.
  gloo::BarrierAllToAll(base).run();
  store.set("done/" + std::to_string(o.rank), {1});
  std::vector<std::string> done;
  for (int r = 0; r < o.world; ++r) done.push_back("done/" + std::to_string(r));
  store.wait(done, std::chrono::seconds(120));
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  auto other = [&o](const std::string& key, const std::string& v) {
    if (key == "--store") o.store = v;
    else if (key == "--host") o.host = v;
    else if (key == "--algos") o.algos = v;
    else if (key == "--rank") o.rank = std::atoi(v.c_str());
    else if (key == "--world") o.world = std::atoi(v.c_str());
    else return false;
    return true;
  };
  const char* extra =
      "  --rank R --world N  this process's rank and the number of ranks\n"
      "  --store DIR       rendezvous directory shared by all ranks (empty, one per job)\n"
      "  --host ADDR       address this rank listens on (default 127.0.0.1)\n"
      "  --algos LIST      allreduce: ring,ring_chunked,halving_doubling,bcube;\n"
      "                    barrier: all_to_one,all_to_all (default: all)\n";
  if (!compare::parse_options(argc, argv, &o, other) || o.store.empty() || o.world < 1 ||
      o.rank < 0 || o.rank >= o.world) {
    compare::usage(argv[0], extra);
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "taiji-compare-gloo: rank %d: %s\n", o.rank, e.what());
    return 2;
  }
}
