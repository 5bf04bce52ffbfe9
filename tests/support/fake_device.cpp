#include "fake_device.h"

#include "device/sequencer.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <span>
#include <utility>

#include "collectives/reduce_kernels.h"

namespace taiji_test {

using taiji::Code;
using taiji::DeviceOp;
using taiji::OpKind;
using taiji::Result;
using taiji::Status;

namespace {

constexpr std::align_val_t kAlign{64};

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

bool supported(OpKind k) {
  return k == OpKind::Allreduce || k == OpKind::Broadcast || k == OpKind::Reduce ||
         k == OpKind::Allgather || k == OpKind::ReduceScatter;
}

std::string describe_op(const DeviceOp& op) {
  return taiji::describe(taiji::DeviceOpSpec{op.kind, op.dtype, op.redop, op.count, op.root});
}

// NCCL's requirement: what every rank passes must agree, except the buffers and streams.
bool same_spec(const DeviceOp& a, const DeviceOp& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.count == b.count &&
         (!op_kind_reduces(a.kind) || a.redop == b.redop) &&
         (!op_kind_rooted(a.kind) || a.root == b.root);
}

}  // namespace

struct Batch {
  std::vector<std::vector<DeviceOp>> ops;  // per rank, until the batch is matched
  int launched = 0;
  bool matched = false;
  bool never = false;  // violation, injected hang, a rank gone, or an earlier batch hung
  uint64_t done_ns = 0;
};

struct RankState {
  bool joined = false;
  uint64_t ready_after_ns = 0;  // joined + injected delay
  Status init_error;
  bool aborted = false;
  bool gone = false;  // its comm was destroyed
  bool finalizing = false;
  bool finalized = false;
  uint64_t launched = 0;
};

struct World {
  int size = 0;
  std::vector<RankState> ranks;
  std::vector<Batch> batches;
};

struct FakeDeviceRuntime::State {
  mutable std::mutex mu;
  std::condition_variable cv;  // finalize's waiters: a rank finalized or aborted
  Status usable;
  uint64_t next_id = 0;
  std::map<std::string, std::shared_ptr<World>> worlds;  // made by make_id, never erased
  std::map<uintptr_t, size_t> memory;                    // base -> bytes
  std::map<int, int64_t> init_delay_ms;
  std::set<std::pair<int, uint64_t>> hangs;
  std::map<int, std::pair<uint64_t, Status>> async_errors;
  std::map<int, Status> init_failures;
  uint64_t device_time_ns = 0;
  uint64_t violations = 0;
  std::vector<std::string> violation_lines;
  uint64_t aborts = 0;
  uint64_t copies = 0;
  std::map<int, std::vector<LaunchedOp>> history;
  std::map<int, std::vector<FenceWait>> fence_history;
  std::vector<std::unique_ptr<char>> stream_tokens;  // what make_stream hands out
  std::map<const void*, uint64_t> stream_work;         // work items queued per stream
  struct Fence {
    const void* stream = nullptr;
    uint64_t position = 0;
  };
  std::map<uint64_t, Fence> fences;  // held
  uint64_t next_fence = 1;
  uint64_t fences_recorded = 0;
  uint64_t stray_releases = 0;

  bool known_stream(const void* stream) const {
    return stream == nullptr || stream_work.count(stream) > 0;
  }
  uint64_t position(const void* stream) const {
    auto it = stream_work.find(stream);
    return it == stream_work.end() ? 0 : it->second;
  }

  // Whether [p, p + bytes) lies inside one allocation.
  bool on_device(const void* p, size_t bytes) const {
    if (p == nullptr || !usable.is_ok()) return false;
    auto a = reinterpret_cast<uintptr_t>(p);
    auto it = memory.upper_bound(a);
    if (it == memory.begin()) return false;
    --it;
    size_t len = std::max<size_t>(it->second, 1);
    return a - it->first < len && bytes <= len - (a - it->first);
  }

  bool all_joined(const World& w) const {
    return std::all_of(w.ranks.begin(), w.ranks.end(), [](const RankState& r) { return r.joined; });
  }
  uint64_t ready_ns(const World& w) const {
    uint64_t t = 0;
    for (const RankState& r : w.ranks) t = std::max(t, r.ready_after_ns);
    return t;
  }
  bool batch_done(const World& w, uint64_t k, uint64_t now) const {
    const Batch& b = w.batches[k];
    return b.matched && !b.never && now >= b.done_ns;
  }

  void match(World& w, uint64_t k);
  std::string check_specs(const World& w, const Batch& b, uint64_t k) const;
};

namespace {

// Runs one op as NCCL would on every rank: inputs are read before any output is written,
// so in-place buffers work.
void compute(const std::vector<const DeviceOp*>& ops) {
  const DeviceOp& spec = *ops[0];
  int n = static_cast<int>(ops.size());
  size_t bytes = spec.count * taiji::dtype_size(spec.dtype);
  std::vector<const void*> inputs;
  for (const DeviceOp* op : ops) inputs.push_back(op->send);
  switch (spec.kind) {
    case OpKind::Allreduce:
    case OpKind::Reduce: {
      std::vector<unsigned char> tmp(bytes);
      taiji::combine_in_order(spec.dtype, spec.redop, tmp.data(), inputs, spec.count);
      for (int r = 0; r < n; ++r)
        if (spec.kind == OpKind::Allreduce || r == spec.root)
          std::memcpy(ops[r]->recv, tmp.data(), bytes);
      break;
    }
    case OpKind::Broadcast: {
      std::vector<unsigned char> tmp(
          static_cast<const unsigned char*>(ops[spec.root]->send),
          static_cast<const unsigned char*>(ops[spec.root]->send) + bytes);
      for (int r = 0; r < n; ++r) std::memcpy(ops[r]->recv, tmp.data(), bytes);
      break;
    }
    case OpKind::Allgather: {
      std::vector<unsigned char> tmp(bytes * n);
      for (int r = 0; r < n; ++r) std::memcpy(tmp.data() + r * bytes, inputs[r], bytes);
      for (int r = 0; r < n; ++r) std::memcpy(ops[r]->recv, tmp.data(), tmp.size());
      break;
    }
    case OpKind::ReduceScatter: {
      std::vector<unsigned char> tmp(bytes * n);
      taiji::combine_in_order(spec.dtype, spec.redop, tmp.data(), inputs, spec.count * n);
      for (int r = 0; r < n; ++r) std::memcpy(ops[r]->recv, tmp.data() + r * bytes, bytes);
      break;
    }
    default:
      break;
  }
}

}  // namespace

std::string FakeDeviceRuntime::State::check_specs(const World& w, const Batch& b,
                                                  uint64_t k) const {
  const auto& first = b.ops[0];
  for (int r = 1; r < w.size; ++r) {
    const auto& mine = b.ops[r];
    std::string where = "batch " + std::to_string(k) + ": rank " + std::to_string(r);
    if (mine.size() != first.size())
      return where + " launched " + std::to_string(mine.size()) + " ops, rank 0 " +
             std::to_string(first.size());
    for (size_t i = 0; i < mine.size(); ++i)
      if (!same_spec(mine[i], first[i]))
        return where + " op " + std::to_string(i) + " is " + describe_op(mine[i]) +
               ", rank 0's is " + describe_op(first[i]);
  }
  return {};
}

void FakeDeviceRuntime::State::match(World& w, uint64_t k) {
  Batch& b = w.batches[k];
  b.matched = true;
  std::string violation = check_specs(w, b, k);
  if (!violation.empty()) {
    ++violations;
    violation_lines.push_back(std::move(violation));
    b.never = true;
  }
  for (int r = 0; r < w.size; ++r) {
    // A rank that aborted may have freed its buffers: nothing of it is read or written.
    if (w.ranks[r].aborted || w.ranks[r].gone || hangs.count({r, k})) b.never = true;
  }
  if (k > 0 && w.batches[k - 1].never) b.never = true;
  if (!b.never) {
    for (size_t i = 0; i < b.ops[0].size(); ++i) {
      std::vector<const DeviceOp*> ops;
      for (int r = 0; r < w.size; ++r) ops.push_back(&b.ops[r][i]);
      compute(ops);
    }
    uint64_t start = std::max(now_ns(), k > 0 ? w.batches[k - 1].done_ns : 0);
    b.done_ns = start + device_time_ns * b.ops[0].size();
  }
  b.ops.clear();
  b.ops.shrink_to_fit();
}

namespace {

class FakeComm : public taiji::DeviceComm {
 public:
  FakeComm(std::shared_ptr<FakeDeviceRuntime::State> s, std::shared_ptr<World> w, int rank)
      : s_(std::move(s)), w_(std::move(w)), rank_(rank) {}

  ~FakeComm() override {
    std::lock_guard lk(s_->mu);
    me().gone = true;
    s_->cv.notify_all();
  }

  Status init_status() override {
    std::lock_guard lk(s_->mu);
    return init_locked();
  }

  Result<uint64_t> launch(const std::vector<DeviceOp>& ops) override {
    std::lock_guard lk(s_->mu);
    if (me().aborted) return Status(Code::Aborted, "fake comm: launch after abort");
    if (me().finalizing) return Status(Code::Finalized, "fake comm: launch after finalize");
    if (!init_locked().is_ok())
      return Status(Code::InvalidArgument, "fake comm: launch before init completed");
    if (ops.empty()) return Status(Code::InvalidArgument, "fake comm: empty group");
    std::vector<FenceWait> waits;
    for (size_t i = 0; i < ops.size(); ++i) {
      Status st = validate(ops[i]);
      if (st.is_ok()) st = start_point(ops[i], waits);
      if (!st.is_ok())
        return Status(st.code(), "fake comm: op " + std::to_string(i) + ": " + st.message());
    }
    uint64_t k = me().launched++;
    if (w_->batches.size() <= k) w_->batches.resize(k + 1);
    Batch& b = w_->batches[k];
    if (b.ops.empty()) b.ops.resize(w_->size);
    b.ops[rank_] = ops;
    auto& hist = s_->history[rank_];
    for (const DeviceOp& op : ops) hist.push_back({op.kind, op.count});
    auto& fenced = s_->fence_history[rank_];
    fenced.insert(fenced.end(), waits.begin(), waits.end());
    if (++b.launched == w_->size) s_->match(*w_, k);
    return k;
  }

  Result<bool> done(uint64_t batch) override {
    std::lock_guard lk(s_->mu);
    if (me().aborted) return Status(Code::Aborted, "fake comm: aborted");
    if (batch >= me().launched) return Status(Code::InvalidArgument, "fake comm: no such batch");
    return s_->batch_done(*w_, batch, now_ns());
  }

  Status async_error() override {
    std::lock_guard lk(s_->mu);
    if (me().aborted) return Status(Code::Aborted, "fake comm: aborted");
    Status init = init_locked();
    if (!init.is_ok()) return init;
    auto it = s_->async_errors.find(rank_);
    if (it != s_->async_errors.end()) {
      uint64_t k = it->second.first;
      if (k < me().launched && s_->batch_done(*w_, k, now_ns())) return it->second.second;
    }
    return Status::ok();
  }

  void abort() override {
    std::lock_guard lk(s_->mu);
    abort_locked();
  }

  Status finalize(int64_t timeout_ms) override {
    std::unique_lock lk(s_->mu);
    if (me().aborted) return Status(Code::Aborted, "fake comm: finalize after abort");
    me().finalizing = true;
    s_->cv.notify_all();
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
    for (;;) {
      if (me().aborted) return Status(Code::Aborted, "fake comm: aborted during finalize");
      if (finalize_done()) {
        me().finalized = true;
        return Status::ok();
      }
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      // Batches complete by the clock, not by a notification: wake at least every ms.
      s_->cv.wait_until(lk, std::min(deadline, now + std::chrono::milliseconds(1)));
    }
    std::string missing;
    for (int r = 0; r < w_->size; ++r)
      if (!w_->ranks[r].finalizing) missing += (missing.empty() ? "" : ",") + std::to_string(r);
    abort_locked();
    return Status(Code::Timeout,
                  "fake comm: finalize did not finish within " + std::to_string(timeout_ms) +
                      " ms (ranks not finalizing: " + (missing.empty() ? "none" : missing) + ")");
  }

 private:
  RankState& me() { return w_->ranks[rank_]; }

  Status init_locked() {
    if (!me().init_error.is_ok()) return me().init_error;
    if (s_->all_joined(*w_) && now_ns() >= s_->ready_ns(*w_)) return Status::ok();
    return Status(Code::InProgress, "fake comm: init in progress");
  }

  void abort_locked() {
    if (me().aborted) return;
    me().aborted = true;
    ++s_->aborts;
    s_->cv.notify_all();
  }

  bool finalize_done() {
    for (const RankState& r : w_->ranks)
      if (!r.finalizing) return false;
    uint64_t now = now_ns();
    for (uint64_t k = 0; k < me().launched; ++k)
      if (!s_->batch_done(*w_, k, now)) return false;
    return true;
  }

  // Where `op` starts on its stream, added to `waits`: at its fence, which must be held
  // and recorded on the op's stream, or without one at the stream's work so far.
  Status start_point(const DeviceOp& op, std::vector<FenceWait>& waits) const {
    if (!s_->known_stream(op.stream)) return Status(Code::InvalidArgument, "unknown stream");
    if (op.fence == 0) {
      waits.push_back({false, op.stream, s_->position(op.stream)});
      return Status::ok();
    }
    auto it = s_->fences.find(op.fence);
    if (it == s_->fences.end())
      return Status(Code::InvalidArgument,
                    "fence " + std::to_string(op.fence) + " is not held (released, or never recorded)");
    if (it->second.stream != op.stream)
      return Status(Code::InvalidArgument, "fence " + std::to_string(op.fence) + " is another stream's");
    waits.push_back({true, op.stream, it->second.position});
    return Status::ok();
  }

  Status validate(const DeviceOp& op) const {
    if (!supported(op.kind))
      return Status(Code::Unsupported,
                    std::string(op_kind_name(op.kind)) + " is not a device collective");
    if (static_cast<int>(op.dtype) >= taiji::kDTypeCount ||
        static_cast<int>(op.redop) >= taiji::kRedOpCount)
      return Status(Code::InvalidArgument, "bad dtype or redop");
    if (op_kind_rooted(op.kind) && (op.root < 0 || op.root >= w_->size))
      return Status(Code::InvalidArgument, "root " + std::to_string(op.root) + " out of range");
    size_t block = op.count * taiji::dtype_size(op.dtype);
    size_t n = static_cast<size_t>(w_->size);
    size_t send = op.kind == OpKind::ReduceScatter ? block * n : block;
    size_t recv = op.kind == OpKind::Allgather ? block * n : block;
    bool needs_send = op.kind != OpKind::Broadcast || op.root == rank_;
    bool needs_recv = op.kind != OpKind::Reduce || op.root == rank_;
    if (needs_send && !s_->on_device(op.send, send))
      return Status(Code::InvalidArgument, "send buffer is not device memory of its size");
    if (needs_recv && !s_->on_device(op.recv, recv))
      return Status(Code::InvalidArgument, "recv buffer is not device memory of its size");
    return Status::ok();
  }

  std::shared_ptr<FakeDeviceRuntime::State> s_;
  std::shared_ptr<World> w_;
  int rank_;
};

}  // namespace

FakeDeviceRuntime::FakeDeviceRuntime() : s_(std::make_shared<State>()) {}

FakeDeviceRuntime::~FakeDeviceRuntime() {
  std::lock_guard lk(s_->mu);
  for (auto& [base, bytes] : s_->memory) ::operator delete(reinterpret_cast<void*>(base), kAlign);
}

Status FakeDeviceRuntime::usable() const {
  std::lock_guard lk(s_->mu);
  return s_->usable;
}

taiji::MemoryPlace FakeDeviceRuntime::place(const void* ptr) const {
  std::lock_guard lk(s_->mu);
  if (s_->on_device(ptr, 0)) return {true, 0};
  return {};
}

Result<std::string> FakeDeviceRuntime::make_id() {
  std::lock_guard lk(s_->mu);
  std::string id = "fake-comm-" + std::to_string(s_->next_id++);
  s_->worlds[id] = nullptr;
  return id;
}

Result<std::unique_ptr<taiji::DeviceComm>> FakeDeviceRuntime::create_comm(const std::string& id,
                                                                          int rank, int size,
                                                                          int ordinal) {
  std::lock_guard lk(s_->mu);
  if (!s_->usable.is_ok()) return s_->usable;
  auto it = s_->worlds.find(id);
  if (it == s_->worlds.end())
    return Status(Code::InvalidArgument, "fake: unknown communicator id '" + id + "'");
  if (size < 1 || rank < 0 || rank >= size || ordinal != 0)
    return Status(Code::InvalidArgument, "fake: bad rank " + std::to_string(rank) + " of " +
                                             std::to_string(size) + " on device " +
                                             std::to_string(ordinal));
  if (!it->second) {
    it->second = std::make_shared<World>();
    it->second->size = size;
    it->second->ranks.resize(size);
  }
  World& w = *it->second;
  if (w.size != size)
    return Status(Code::InvalidArgument, "fake: world size " + std::to_string(size) +
                                             " differs from " + std::to_string(w.size));
  RankState& r = w.ranks[rank];
  if (r.joined)
    return Status(Code::InvalidArgument, "fake: rank " + std::to_string(rank) + " joined twice");
  r.joined = true;
  auto delay = s_->init_delay_ms.find(rank);
  r.ready_after_ns = now_ns() + (delay == s_->init_delay_ms.end() ? 0 : delay->second * 1000000ull);
  auto failure = s_->init_failures.find(rank);
  if (failure != s_->init_failures.end()) r.init_error = failure->second;
  return std::unique_ptr<taiji::DeviceComm>(new FakeComm(s_, it->second, rank));
}

taiji::Status FakeDeviceRuntime::copy(void* dst, const void* src, uint64_t bytes, bool to_device,
                                      int ordinal, void*) {
  std::lock_guard lk(s_->mu);
  if (!s_->usable.is_ok()) return s_->usable;
  const void* device = to_device ? static_cast<const void*>(dst) : src;
  const void* host = to_device ? src : static_cast<const void*>(dst);
  if (ordinal != 0 || !s_->on_device(device, bytes) || (bytes > 0 && host == nullptr)) {
    return {taiji::Code::InvalidArgument, "copy: the device side is not fake device memory of device 0"};
  }
  if (bytes > 0) std::memcpy(dst, src, bytes);
  ++s_->copies;
  return {};
}

uint64_t FakeDeviceRuntime::copies() const {
  std::lock_guard lk(s_->mu);
  return s_->copies;
}

std::string FakeDeviceRuntime::describe() const {
  std::lock_guard lk(s_->mu);
  return s_->usable.is_ok() ? "fake device runtime, 1 device"
                            : "fake device runtime: " + s_->usable.message();
}

Result<uint64_t> FakeDeviceRuntime::record_fence(void* stream, int ordinal) {
  std::lock_guard lk(s_->mu);
  if (!s_->usable.is_ok()) return s_->usable;
  if (ordinal != 0)
    return Status(Code::InvalidArgument, "fake: record_fence on device " + std::to_string(ordinal));
  if (!s_->known_stream(stream)) return Status(Code::InvalidArgument, "fake: record_fence on an unknown stream");
  uint64_t fence = s_->next_fence++;
  s_->fences[fence] = {stream, s_->position(stream)};
  ++s_->fences_recorded;
  return fence;
}

void FakeDeviceRuntime::release_fence(uint64_t fence) {
  if (fence == 0) return;
  std::lock_guard lk(s_->mu);
  if (s_->fences.erase(fence) == 0) ++s_->stray_releases;
}

void* FakeDeviceRuntime::make_stream() {
  auto token = std::make_unique<char>();
  std::lock_guard lk(s_->mu);
  void* stream = token.get();
  s_->stream_tokens.push_back(std::move(token));
  s_->stream_work[stream] = 0;
  return stream;
}

uint64_t FakeDeviceRuntime::queue_work(void* stream, uint64_t items) {
  std::lock_guard lk(s_->mu);
  return s_->stream_work[stream] += items;
}

std::vector<FenceWait> FakeDeviceRuntime::fence_waits(int rank) const {
  std::lock_guard lk(s_->mu);
  auto it = s_->fence_history.find(rank);
  return it == s_->fence_history.end() ? std::vector<FenceWait>{} : it->second;
}

uint64_t FakeDeviceRuntime::fences_recorded() const {
  std::lock_guard lk(s_->mu);
  return s_->fences_recorded;
}

uint64_t FakeDeviceRuntime::fences_held() const {
  std::lock_guard lk(s_->mu);
  return s_->fences.size();
}

uint64_t FakeDeviceRuntime::stray_fence_releases() const {
  std::lock_guard lk(s_->mu);
  return s_->stray_releases;
}

void* FakeDeviceRuntime::alloc(size_t bytes) {
  void* p = ::operator new(std::max<size_t>(bytes, 1), kAlign);
  std::lock_guard lk(s_->mu);
  s_->memory[reinterpret_cast<uintptr_t>(p)] = bytes;
  return p;
}

void FakeDeviceRuntime::release(void* ptr) {
  std::lock_guard lk(s_->mu);
  if (s_->memory.erase(reinterpret_cast<uintptr_t>(ptr)) > 0) ::operator delete(ptr, kAlign);
}

void FakeDeviceRuntime::make_unusable(const std::string& why) {
  std::lock_guard lk(s_->mu);
  s_->usable = Status(Code::NoDevice, why);
}

void FakeDeviceRuntime::init_delay_ms(int rank, int64_t ms) {
  std::lock_guard lk(s_->mu);
  s_->init_delay_ms[rank] = ms;
}

void FakeDeviceRuntime::hang_batch(int rank, uint64_t k) {
  std::lock_guard lk(s_->mu);
  s_->hangs.insert({rank, k});
}

void FakeDeviceRuntime::async_error_after(int rank, uint64_t k, Status status) {
  std::lock_guard lk(s_->mu);
  s_->async_errors[rank] = {k, std::move(status)};
}

void FakeDeviceRuntime::fail_init(int rank, Status status) {
  std::lock_guard lk(s_->mu);
  s_->init_failures[rank] = std::move(status);
}

void FakeDeviceRuntime::device_time_us(uint64_t us) {
  std::lock_guard lk(s_->mu);
  s_->device_time_ns = us * 1000;
}

uint64_t FakeDeviceRuntime::violations() const {
  std::lock_guard lk(s_->mu);
  return s_->violations;
}

std::string FakeDeviceRuntime::violation_text() const {
  std::lock_guard lk(s_->mu);
  std::string text;
  for (const std::string& line : s_->violation_lines) text += line + "\n";
  return text;
}

uint64_t FakeDeviceRuntime::aborts() const {
  std::lock_guard lk(s_->mu);
  return s_->aborts;
}

std::vector<LaunchedOp> FakeDeviceRuntime::launched(int rank) const {
  std::lock_guard lk(s_->mu);
  auto it = s_->history.find(rank);
  return it == s_->history.end() ? std::vector<LaunchedOp>{} : it->second;
}

}  // namespace taiji_test
