// taiji-compare-mpi: MPI_Allreduce / MPI_Bcast / MPI_Barrier timed the way taiji-bench
// times taiji (see peer_common.h). The transport is whatever mpirun selects, e.g.
//   mpirun --allow-run-as-root --oversubscribe -np 4 --mca btl tcp,self taiji-compare-mpi
// Allreduce runs out of place, like taiji-bench, so the timed inputs never change.
#include <mpi.h>

#include <memory>

#include "peer_common.h"

namespace {

using compare::Op;
using compare::Options;

struct Result {
  std::vector<double> times;
  double cpu = 0;
  bool ok = true;
};

Result run_size(const Options& o, int rank, int world, uint64_t bytes, int iters) {
  const size_t count = bytes / 4;
  std::vector<float> send(std::max<size_t>(count, 1));
  std::vector<float> recv(send.size());
  auto op = [&]() {
    if (o.op == Op::kAllreduce) {
      MPI_Allreduce(send.data(), recv.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    } else if (o.op == Op::kBroadcast) {
      MPI_Bcast(recv.data(), static_cast<int>(count), MPI_FLOAT, 0, MPI_COMM_WORLD);
    } else {
      MPI_Barrier(MPI_COMM_WORLD);
    }
  };
  if (o.op == Op::kAllreduce) compare::fill_allreduce(send.data(), count, rank, 0);
  if (o.op == Op::kBroadcast) compare::fill_broadcast(recv.data(), count, rank == 0, 0);

  Result r;
  r.times.resize(static_cast<size_t>(iters));
  for (int i = 0; i < o.warmup; ++i) op();
  MPI_Barrier(MPI_COMM_WORLD);
  const double cpu0 = compare::cpu_seconds();
  double refill_cpu = 0;
  for (size_t i = 0; i < r.times.size(); ++i) {
    if (i > 0 && i + 1 == r.times.size()) {
      // The last timed op writes into a cleared output (untimed, its CPU not counted), so
      // the check below reads what a timed op wrote.
      const double c0 = compare::cpu_seconds();
      if (o.op == Op::kAllreduce) std::fill(recv.begin(), recv.end(), -1.0f);
      if (o.op == Op::kBroadcast) compare::fill_broadcast(recv.data(), count, rank == 0, 0);
      refill_cpu += compare::cpu_seconds() - c0;
    }
    const double start = compare::now_seconds();
    op();
    r.times[i] = compare::now_seconds() - start;
  }
  double cpu = compare::cpu_seconds() - cpu0 - refill_cpu;

  int pass = 1;
  if (o.op == Op::kAllreduce) {
    if (!compare::verify_allreduce(recv.data(), count, world, 0)) pass = 0;
    compare::fill_allreduce(send.data(), count, rank, 1);
    std::fill(recv.begin(), recv.end(), -1.0f);
    op();
    if (!compare::verify_allreduce(recv.data(), count, world, 1)) pass = 0;
  } else if (o.op == Op::kBroadcast) {
    if (!compare::verify_broadcast(recv.data(), count, 0)) pass = 0;
    compare::fill_broadcast(recv.data(), count, rank == 0, 1);
    op();
    if (!compare::verify_broadcast(recv.data(), count, 1)) pass = 0;
  }
  if (pass == 0) {
    std::fprintf(stderr, "taiji-compare-mpi: rank %d: wrong %s result at %llu bytes\n", rank,
                 compare::op_name(o.op), static_cast<unsigned long long>(bytes));
  }
  MPI_Allreduce(MPI_IN_PLACE, r.times.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &cpu, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &pass, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  r.cpu = cpu;
  r.ok = pass == 1;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!compare::parse_options(argc, argv, &o, [](const std::string&, const std::string&) {
        return false;
      })) {
    compare::usage(argv[0], "Run it under mpirun; the MPI library picks the transport.\n");
    return 2;
  }
  MPI_Init(&argc, &argv);
  int rank = 0;
  int world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  bool all_ok = true;
  for (uint64_t bytes : compare::sizes(o)) {
    const int iters = compare::iterations(o, bytes);
    Result r = run_size(o, rank, world, bytes, iters);
    all_ok = all_ok && r.ok;
    if (rank == 0) {
      compare::print_row(o, "mpi", "default", world, bytes, iters, r.times, r.cpu, r.ok);
    }
  }
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
