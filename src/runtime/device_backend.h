// The device-memory backend: an op whose buffers live on a GPU runs over NCCL, with
// taiji's contract kept. Ranks announce their posted device ops to rank 0 over taiji's own
// links; rank 0's sequencer (device/sequencer.h) orders each op once every rank has posted
// it, after checking that they agree on it, and every rank hands the same batches, in the
// same order, to its executor (device/device_executor.h), the one thread that calls NCCL.
// Named ops may so be posted in any order, a disagreement is a Mismatch instead of an NCCL
// hang, and a failure anywhere (a deadline, an NCCL error, a lost link, an abort) aborts
// the communicator on every rank instead of leaving the survivors hanging.
//
// The communicator starts with the first op every rank posted: rank 0 makes its id and
// sends it ahead of that order. Each membership (and each sub-group) is its own Peer, so
// it gets a communicator of its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/device_api.h"
#include "device/device_executor.h"
#include "device/nccl_runtime.h"
#include "device/sequencer.h"
#include "runtime/backend.h"
#include "runtime/io_loop.h"
#include "runtime/name_table.h"
#include "runtime/router.h"

namespace taiji {

struct PostArgs;

struct DeviceBackendOptions {
  DeviceLoadOptions load;
  int rank = 0;
  int size = 1;
  int64_t init_timeout_ms = 60000;
};

class DeviceBackend final : public Backend, public ReceiveHandler {
 public:
  DeviceBackend(DeviceBackendOptions options, IoLoop* io, NameTable* names);
  ~DeviceBackend() override;
  void set_transport(Transport* transport) { transport_ = transport; }
  void serve(Router& router);

  // Any thread, at post: decides where the op's buffers live (args.memory, else the CUDA
  // runtime's word) and marks a device op. Errors: NoDevice, InvalidArgument (mixed
  // memories), Unsupported (a kind NCCL does not run).
  Status place(const PostArgs& args, PostedOp& op);
  // Whether device ops can run here (loads the runtime on first use); the reason if not.
  Status usable();
  // Any thread: a synchronous copy between device and host memory (DeviceRuntime::copy).
  Status copy(void* dst, const void* src, uint64_t bytes, bool to_device, int ordinal, void* stream) {
    return runtime()->copy(dst, src, bytes, to_device, ordinal, stream);
  }

  bool accepts(const PostedOp& op) const override { return op.device; }
  void start(std::shared_ptr<PostedOp> op, bool fusable) override;
  bool idle() const override { return ops_.empty(); }
  void tick() override;
  void fail_all(const Status& why) override;
  void links_closed() override;

  Status accept_frame(int src, const FrameHeader& h, const std::string& name,
                      const uint8_t* in_memory, uint8_t** target) override;
  void frame_done(int src, const FrameHeader& h, const std::string& name) override;
  void link_down(int src, bool graceful, const Status& why) override;

 private:
  enum class Stage : uint8_t { Announce = 0, Order = 1, Init = 2, Failed = 3 };
  struct Entry {
    std::shared_ptr<PostedOp> op;
    uint64_t tag = 0;
    uint64_t deadline_ms = 0;
    bool ordered = false;     // handed to the executor
    bool withdrawn = false;   // this rank asked the coordinator to drop it
  };
  using Key = std::pair<std::string, uint64_t>;

  std::shared_ptr<DeviceRuntime> runtime();
  void send(int dst, Stage stage, std::vector<uint8_t> payload, int32_t root = 0);
  void flush();
  // The coordinator's side: a message from `src` (itself included), then any batch due.
  void coordinate(int src, const std::vector<uint8_t>& msg);
  // A non-zero rank: rank 0's order message, decoded, then run.
  void apply_order(const std::vector<uint8_t>& msg);
  void run_order(const std::vector<OrderEntry>& entries);
  void ensure_executor();
  void init_comm(const std::string& id);
  void finish(uint64_t tag, const Status& status);
  // The communicator failed (here, or on `from`): sticky; every op fails with it.
  void fail_device(const Status& why, bool tell_others);
  std::string label(const PostedOp& op) const;

  DeviceBackendOptions opt_;
  IoLoop* io_;
  NameTable* names_;
  Transport* transport_ = nullptr;

  std::mutex runtime_mu_;
  std::shared_ptr<DeviceRuntime> runtime_;  // loaded at the first op that asks

  SequencerClient client_;
  std::unique_ptr<Sequencer> sequencer_;  // rank 0 only
  std::unique_ptr<DeviceExecutor> executor_;
  bool comm_started_ = false;
  // The device of this rank's first device op: the communicator's, for good (any thread).
  std::atomic<int> ordinal_{-1};
  std::map<Key, Entry> ops_;
  std::map<uint64_t, Key> by_tag_;
  uint64_t next_tag_ = 1;
  Status sticky_;
  // The payload of the frame being read from each rank: frames of several ranks may be
  // half read at once.
  std::vector<std::vector<uint8_t>> frame_in_;
  // Announcements posted since the last flush: sent as one message per loop pass, so that
  // ops posted together are ordered (and launched) together.
  std::vector<uint8_t> outbox_;
  bool flush_scheduled_ = false;
};

}  // namespace taiji
