// The hierarchical strategy for a device allreduce (Horovod's hierarchical allreduce): NCCL
// within each host, taiji's host backend (TCP) between hosts.
//
//  1. An NCCL reduce to the host's leader (its lowest rank), on the `local` child job.
//  2. The leader copies the result to a host staging buffer (DeviceRuntime::copy).
//  3. An allreduce of the staging buffers among the leaders, on the `leaders` child job
//     (host memory: the host backend). Avg: steps 1 and 3 sum, and the leader divides by
//     the parent's size here.
//  4. The leader copies the staging buffer back to the device.
//  5. An NCCL broadcast from the leader, on the `local` child job.
//
// The two child jobs are Peers made by Peer::split of the parent (runtime/peer_split.cpp):
// `local` by host, `leaders` of each host's lowest rank (no child elsewhere). Each stage is
// posted from the previous one's completion callback (on a child's I/O thread; posting
// never blocks), under a name derived from the parent op's name and version, so that the
// parent's ops may be posted in any order. The first error ends the chain; a rank whose
// chain ended early leaves the others' next stage to fail at its deadline.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace taiji {

class Peer;

class DeviceHierarchy {
 public:
  using Clock = std::chrono::steady_clock;
  // A synchronous device <-> host copy (DeviceRuntime::copy).
  using Copy = std::function<Status(void* dst, const void* src, uint64_t bytes, bool to_device,
                                    int ordinal, void* stream)>;

  // One parent allreduce.
  struct Op {
    std::string name;  // the parent's (name, version): the children's names derive from it
    uint64_t version = 0;
    const void* send = nullptr;  // device memory on device `ordinal`
    void* recv = nullptr;
    uint64_t count = 0;
    DType dtype = DType::F32;
    RedOp redop = RedOp::Sum;
    void* stream = nullptr;
    int ordinal = 0;
    Clock::time_point deadline;
    // Called once, with Ok or the first error, from whichever thread ends the chain.
    std::function<void(const Status&)> finish;
  };

  // Splits `parent` into the two child jobs. A collective of the parent: every rank calls
  // it; blocks (bounded by timeout_ms); not from a completion callback.
  // host_of: the parent cluster's host index per rank.
  static Result<std::unique_ptr<DeviceHierarchy>> create(Peer& parent, const std::vector<int>& host_of,
                                                         int64_t timeout_ms, Copy copy);
  ~DeviceHierarchy();

  // Any thread: starts the chain; op.finish runs once it ends. Refused (finish not called)
  // once closing.
  Status start(Op op);
  // Waits (at most wait_ms) for the chains in flight, then finalizes the children.
  void finalize(int64_t wait_ms);
  // Aborts the children: chains in flight fail at once.
  void abort();

  int local_size() const;
  bool leader() const { return leaders_ != nullptr; }

  DeviceHierarchy(const DeviceHierarchy&) = delete;
  DeviceHierarchy& operator=(const DeviceHierarchy&) = delete;

 private:
  struct Flight;
  DeviceHierarchy(std::unique_ptr<Peer> local, std::unique_ptr<Peer> leaders, int world, Copy copy);
  void reduced(const std::shared_ptr<Flight>& f, const Status& s);
  void exchanged(const std::shared_ptr<Flight>& f, const Status& s);
  void broadcast(const std::shared_ptr<Flight>& f);
  void end(const std::shared_ptr<Flight>& f, const Status& s);
  // Posts one stage on `child`; its error (Timeout when no time is left) when it cannot.
  Status post_stage(const std::shared_ptr<Flight>& f, Peer& child, int kind, const char* suffix,
                    bool device);

  std::unique_ptr<Peer> local_;
  std::unique_ptr<Peer> leaders_;  // null on a rank that is not its host's leader
  const int world_;                // the parent's size: Avg divides by it
  Copy copy_;

  std::mutex mu_;
  std::condition_variable idle_;
  bool closing_ = false;  // under mu_
  int in_flight_ = 0;     // under mu_
};

}  // namespace taiji
