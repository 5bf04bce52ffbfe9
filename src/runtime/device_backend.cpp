#include "runtime/device_backend.h"

#include <algorithm>

#include "device/nccl_types.h"
#include "monitor/log.h"
#include "monitor/metrics.h"
#include "runtime/op_poster.h"

namespace taiji {

namespace {

constexpr const char* kFrameName = "taiji.device";
// After a withdrawal, how long this rank waits for the coordinator's word on the op (it
// runs if it was ordered first) before it fails the op on its own.
constexpr uint64_t kWithdrawGraceMs = 5000;
// How long past an ordered op's deadline the loop waits for the executor's own watchdog.
constexpr uint64_t kExecutorGraceMs = 1000;
// The longest reason a Failed frame may carry, and the largest sequencing message.
constexpr uint64_t kMaxReasonBytes = 4096;
constexpr uint64_t kMaxMessageBytes = 64 << 20;
// taiji_memory_t's values (include/taiji/taiji.h).
constexpr int kMemoryAuto = 0;
constexpr int kMemoryHost = 1;
constexpr int kMemoryDevice = 2;

// SequencerClient::announce drops the fields a kind ignores (redop, root) itself.
DeviceOpSpec spec_of(const PostedOp& op) {
  return {op.spec.kind, op.spec.dtype, op.spec.redop, op.spec.count, op.spec.root};
}

}  // namespace

DeviceBackend::DeviceBackend(DeviceBackendOptions options, IoLoop* io, NameTable* names)
    : opt_(std::move(options)), io_(io), names_(names), frame_in_(static_cast<size_t>(opt_.size)) {
  if (opt_.rank == 0) sequencer_ = std::make_unique<Sequencer>(opt_.size);
}

DeviceBackend::~DeviceBackend() = default;

void DeviceBackend::serve(Router& router) { router.add(MsgType::Device, this); }

std::shared_ptr<DeviceRuntime> DeviceBackend::runtime() {
  std::lock_guard<std::mutex> lock(runtime_mu_);
  // The process shares one loaded runtime; a peer with TAIJI_NCCL=off loads nothing.
  if (!runtime_) {
    runtime_ = opt_.load.mode == DeviceLoadOptions::Mode::Off ? load_nccl_runtime(opt_.load)
                                                               : device_runtime(opt_.load);
  }
  return runtime_;
}

Status DeviceBackend::usable() { return runtime()->usable(); }

Status DeviceBackend::place(const PostArgs& args, PostedOp& op) {
  if (args.memory == kMemoryHost) return {};
  if (args.memory != kMemoryAuto && args.memory != kMemoryDevice) {
    return {Code::InvalidArgument, "options.memory " + std::to_string(args.memory) +
                                       " is not TAIJI_MEMORY_AUTO, _HOST or _DEVICE"};
  }
  // Barrier and consensus stay on the host path: they have no device buffers to move.
  if (args.kind == OpKind::Barrier || args.kind == OpKind::Consensus) {
    if (args.memory == kMemoryDevice && args.kind == OpKind::Consensus) {
      return {Code::Unsupported, "consensus runs on host memory only"};
    }
    return {};
  }
  const bool has_send = args.send != nullptr;
  const bool has_recv = args.recv != nullptr;
  if (!has_send && !has_recv) {
    if (args.memory != kMemoryDevice) return {};
  }
  auto rt = runtime();
  Status usable = rt->usable();
  if (!usable.is_ok()) {
    if (args.memory == kMemoryDevice) {
      return {Code::NoDevice, op_kind_name(args.kind) + std::string(" '") + args.name +
                                  "' on device memory: " + usable.message()};
    }
    return {};  // nothing here can hold device memory: host buffers
  }
  MemoryPlace send = has_send ? rt->place(args.send) : MemoryPlace{};
  MemoryPlace recv = has_recv ? rt->place(args.recv) : MemoryPlace{};
  if (has_send && has_recv && send.device != recv.device) {
    return {Code::InvalidArgument, std::string("the send buffer is ") + (send.device ? "device" : "host") +
                                       " memory and the receive buffer " + (recv.device ? "device" : "host") +
                                       " memory: both must be in one"};
  }
  const bool device = has_send ? send.device : recv.device;
  if (args.memory == kMemoryDevice && !device && (has_send || has_recv)) {
    return {Code::InvalidArgument, "options.memory is TAIJI_MEMORY_DEVICE but the buffers are host memory"};
  }
  if (!device && args.memory != kMemoryDevice) return {};
  if (Status s = device_op_supported(args.kind); !s.is_ok()) return s;
  if (args.norms) {
    return {Code::Unsupported, "gradient statistics read the tensor on the host: not on device memory"};
  }
  if (Status s = nccl_dtype(args.dtype).status(); !s.is_ok()) return s;
  if (op_kind_reduces(args.kind)) {
    if (Status s = nccl_redop(args.redop).status(); !s.is_ok()) return s;
  }
  op.device = true;
  op.ordinal = has_send ? send.ordinal : recv.ordinal;
  // One communicator per peer, on one device: the first device op's.
  int expected = -1;
  if (!ordinal_.compare_exchange_strong(expected, op.ordinal) && expected != op.ordinal) {
    return {Code::InvalidArgument, "the buffers are on device " + std::to_string(op.ordinal) +
                                       "; this peer's device ops run on device " + std::to_string(expected)};
  }
  op.stream = args.stream;
  // The op starts after what the caller queued on its stream so far, and not after what
  // it queues later (that may wait for this op): the position is taken here, at the post.
  auto fence = rt->record_fence(args.stream, op.ordinal);
  if (!fence.is_ok()) {
    return {fence.status().code(), op_kind_name(args.kind) + std::string(" '") + args.name +
                                       "': fencing the caller's stream: " + fence.status().message()};
  }
  op.fence = DeviceFence(rt, fence.value());
  return {};
}

std::string DeviceBackend::label(const PostedOp& op) const {
  return std::string(op_kind_name(op.spec.kind)) + " '" + op.name + "' version " + std::to_string(op.version);
}

void DeviceBackend::start(std::shared_ptr<PostedOp> op, bool) {
  Key key{op->name, op->version};
  if (!sticky_.is_ok()) {
    op->fence.reset();
    names_->release(key.first, key.second);
    op->request->complete(sticky_);
    return;
  }
  Entry e;
  e.tag = next_tag_++;
  e.deadline_ms = uv_now(io_->uv()) + op->timeout_ms;
  e.op = op;
  by_tag_[e.tag] = key;
  client_.announce(op->name, op->version, spec_of(*op), outbox_);
  ops_.emplace(key, std::move(e));
  if (!flush_scheduled_) {
    flush_scheduled_ = true;
    if (!io_->run_on_loop([this] { flush(); })) flush();
  }
}

void DeviceBackend::flush() {
  flush_scheduled_ = false;
  if (outbox_.empty() || !sticky_.is_ok()) return outbox_.clear();
  std::vector<uint8_t> msg = std::move(outbox_);
  outbox_.clear();
  if (opt_.rank == 0) {
    coordinate(0, msg);
  } else {
    send(0, Stage::Announce, std::move(msg));
  }
}

void DeviceBackend::send(int dst, Stage stage, std::vector<uint8_t> payload, int32_t root) {
  if (transport_ == nullptr) return;
  OutMessage m;
  m.header.type = MsgType::Device;
  m.header.stage = static_cast<uint8_t>(stage);
  m.header.root = root;
  m.name = kFrameName;
  m.owned = std::move(payload);
  transport_->send(dst, std::move(m));
}

void DeviceBackend::coordinate(int src, const std::vector<uint8_t>& msg) {
  if (!sticky_.is_ok()) return;
  Status s = sequencer_->receive(src, msg.data(), msg.size());
  if (!s.is_ok()) {
    fail_device({Code::Protocol, "device sequencing message from rank " + std::to_string(src) + ": " + s.message()},
                true);
    return;
  }
  std::vector<uint8_t> order = sequencer_->take_order();
  if (order.empty()) return;
  // Decoded once, here: rank 0 applies the entries it sends.
  auto entries = client_.read_order(order.data(), order.size());
  if (!entries.is_ok()) {
    fail_device({Code::Internal, "device order made by this rank: " + entries.status().message()}, true);
    return;
  }
  // The communicator's id goes ahead of the first order that runs an op: links keep
  // order, so every rank has it before it needs it.
  const bool runs = std::any_of(entries.value().begin(), entries.value().end(),
                                [](const OrderEntry& e) { return e.verdict == OrderEntry::Verdict::Run; });
  if (!comm_started_ && runs) {
    auto id = runtime()->make_id();
    if (!id.is_ok()) {
      fail_device({Code::NoDevice, "device communicator id: " + id.status().message()}, true);
      return;
    }
    std::vector<uint8_t> bytes(id.value().begin(), id.value().end());
    for (int r = 1; r < opt_.size; ++r) send(r, Stage::Init, bytes);
    init_comm(id.value());
  }
  for (int r = 1; r < opt_.size; ++r) send(r, Stage::Order, order);
  run_order(entries.value());
}

void DeviceBackend::ensure_executor() {
  if (executor_) return;
  DeviceExecutorOptions eo;
  eo.init_timeout_ms = opt_.init_timeout_ms;
  // Both run on the executor's thread: the outcome is the loop's to apply.
  executor_ = std::make_unique<DeviceExecutor>(
      runtime(), eo,
      [this](uint64_t tag, const Status& s) { io_->run_on_loop([this, tag, s] { finish(tag, s); }); },
      [this](const Status& why) { io_->run_on_loop([this, why] { fail_device(why, true); }); });
}

void DeviceBackend::init_comm(const std::string& id) {
  if (comm_started_ || !sticky_.is_ok()) return;
  comm_started_ = true;
  ensure_executor();
  executor_->init(id, opt_.rank, opt_.size, std::max(ordinal_.load(), 0));
}

void DeviceBackend::apply_order(const std::vector<uint8_t>& msg) {
  if (!sticky_.is_ok()) return;
  auto entries = client_.read_order(msg.data(), msg.size());
  if (!entries.is_ok()) {
    fail_device({Code::Protocol, "device order from rank 0: " + entries.status().message()}, true);
    return;
  }
  run_order(entries.value());
}

void DeviceBackend::run_order(const std::vector<OrderEntry>& entries) {
  if (!sticky_.is_ok()) return;
  std::vector<DeviceWork> batch;
  for (const OrderEntry& oe : entries) {
    auto it = ops_.find({oe.name, oe.version});
    // A withdrawal reaches every rank, also those that have not posted the op (yet): the
    // coordinator answers their later announcement with the same verdict.
    if (oe.verdict == OrderEntry::Verdict::Withdrawn && (it == ops_.end() || it->second.ordered)) continue;
    if (it == ops_.end() || it->second.ordered) {
      // Every rank posted it before it was ordered: a rank without it breaks the protocol.
      fail_device({Code::Protocol, "rank 0 ordered '" + oe.name + "' version " + std::to_string(oe.version) +
                                       ", which this rank has not posted"},
                  true);
      return;
    }
    Entry& e = it->second;
    if (oe.verdict == OrderEntry::Verdict::Mismatch) {
      finish(e.tag, {Code::Mismatch, oe.why});
      continue;
    }
    if (oe.verdict == OrderEntry::Verdict::Withdrawn) {
      finish(e.tag, {Code::Timeout, oe.why});
      continue;
    }
    e.ordered = true;
    DeviceWork w;
    w.tag = e.tag;
    w.label = label(*e.op);
    const CollectiveSpec& cs = e.op->spec;
    w.op.kind = cs.kind;
    w.op.dtype = cs.dtype;
    w.op.redop = cs.redop;
    w.op.count = cs.count;
    w.op.root = cs.root;
    w.op.send = cs.send;
    w.op.recv = cs.recv;
    w.op.stream = e.op->stream;
    // The executor holds the fence from here: it releases it once the op is launched.
    w.op.fence = e.op->fence.handle();
    w.fence = std::move(e.op->fence);
    // The op's budget runs from when every rank had posted it (rank 0's order), not from
    // this rank's post: a rank that posted early must not abort a communicator the others
    // have just reached. Saturating: a timeout of "never" stays never.
    const uint64_t budget_ns = e.op->timeout_ms > UINT64_MAX / 2000000 ? UINT64_MAX / 2 : e.op->timeout_ms * 1000000;
    w.deadline_ns = monotonic_ns() + budget_ns;
    e.deadline_ms = uv_now(io_->uv()) + budget_ns / 1000000;
    batch.push_back(std::move(w));
  }
  if (batch.empty()) return;
  if (!comm_started_) {
    fail_device({Code::Protocol, "rank 0 ordered device ops before sending the communicator's id"}, true);
    return;
  }
  executor_->submit(std::move(batch));
}

void DeviceBackend::finish(uint64_t tag, const Status& status) {
  auto t = by_tag_.find(tag);
  if (t == by_tag_.end()) return;  // ended already (failed here before the executor said)
  auto it = ops_.find(t->second);
  by_tag_.erase(t);
  if (it == ops_.end()) return;
  std::shared_ptr<PostedOp> op = std::move(it->second.op);
  ops_.erase(it);
  // Whoever else holds the op may keep it alive; its fence is not needed past here.
  op->fence.reset();
  names_->release(op->name, op->version);
  Status result = status;
  if (op->finish_hook) result = op->finish_hook(result);
  op->request->complete(result);
}

void DeviceBackend::fail_device(const Status& why, bool tell_others) {
  if (!sticky_.is_ok()) return;
  sticky_ = why;
  // A peer closing with no device work is no failure worth a line.
  if (!ops_.empty()) log().error("device backend failed: {}", why.message());
  if (executor_) executor_->abort(why);
  if (tell_others) {
    std::vector<uint8_t> reason(why.message().begin(),
                                why.message().begin() + std::min<size_t>(why.message().size(), kMaxReasonBytes));
    for (int r = 0; r < opt_.size; ++r) {
      if (r != opt_.rank) send(r, Stage::Failed, reason, -static_cast<int32_t>(why.code()));
    }
  }
  std::vector<uint64_t> tags;
  for (const auto& [key, e] : ops_) tags.push_back(e.tag);
  for (uint64_t tag : tags) finish(tag, why);
}

void DeviceBackend::tick() {
  if (ops_.empty()) return;
  const uint64_t now = uv_now(io_->uv());
  std::vector<uint64_t> expired;
  for (auto& [key, e] : ops_) {
    // Ordered ops are the executor's to time (it aborts the communicator); should its
    // thread be held inside NCCL past a deadline, the loop aborts it from here.
    if (e.ordered) {
      if (now >= e.deadline_ms + kExecutorGraceMs) {
        fail_device({Code::Timeout, label(*e.op) + " did not complete before its deadline (the device executor "
                                                   "was held inside NCCL); the device communicator was aborted"},
                    true);
        return;
      }
      continue;
    }
    if (now < e.deadline_ms) continue;
    if (!e.withdrawn) {
      e.withdrawn = true;
      e.deadline_ms = now + kWithdrawGraceMs;
      std::vector<uint8_t> msg;
      client_.withdraw(key.first, key.second, msg);
      if (opt_.rank == 0) {
        // coordinate() may end this op (and others): finish the loop first.
        io_->run_on_loop([this, msg] { coordinate(0, msg); });
      } else {
        send(0, Stage::Announce, std::move(msg));
      }
    } else {
      expired.push_back(e.tag);
    }
  }
  for (uint64_t tag : expired) {
    finish(tag, {Code::Timeout, "device op timed out before every rank had posted it (rank 0 did not answer "
                                "its withdrawal)"});
  }
}

void DeviceBackend::fail_all(const Status& why) { fail_device(why, false); }

void DeviceBackend::links_closed() {
  fail_device({Code::Aborted, "peer closed with the device op in flight"}, false);
  executor_.reset();
}

Status DeviceBackend::accept_frame(int src, const FrameHeader& h, const std::string& name, const uint8_t*,
                                   uint8_t** target) {
  if (name != kFrameName) return {Code::Protocol, "Device frame named '" + name + "'"};
  const auto stage = static_cast<Stage>(h.stage);
  if (stage == Stage::Announce && opt_.rank != 0) {
    return {Code::Protocol, "Device announcement sent to rank " + std::to_string(opt_.rank) + " (rank 0 orders)"};
  }
  if ((stage == Stage::Order || stage == Stage::Init) && (src != 0 || opt_.rank == 0)) {
    return {Code::Protocol, "Device order from rank " + std::to_string(src) + " (only rank 0 orders)"};
  }
  const uint64_t cap = stage == Stage::Failed ? kMaxReasonBytes : kMaxMessageBytes;
  if (h.payload_len > cap) {
    return {Code::Protocol, "Device frame of " + std::to_string(h.payload_len) + " bytes (at most " +
                                std::to_string(cap) + ")"};
  }
  std::vector<uint8_t>& in = frame_in_[static_cast<size_t>(src)];
  in.assign(h.payload_len, 0);
  *target = in.empty() ? nullptr : in.data();
  return {};
}

void DeviceBackend::frame_done(int src, const FrameHeader& h, const std::string&) {
  std::vector<uint8_t> msg = std::move(frame_in_[static_cast<size_t>(src)]);
  frame_in_[static_cast<size_t>(src)].clear();
  switch (static_cast<Stage>(h.stage)) {
    case Stage::Announce:
      coordinate(src, msg);
      break;
    case Stage::Order:
      apply_order(msg);
      break;
    case Stage::Init:
      init_comm(std::string(msg.begin(), msg.end()));
      break;
    case Stage::Failed: {
      const int32_t code = -h.root;
      const Code c = code_label(code) != nullptr && code != 0 ? static_cast<Code>(code) : Code::Internal;
      fail_device({c, "rank " + std::to_string(src) + "'s device communicator failed: " +
                          std::string(msg.begin(), msg.end())},
                  false);
      break;
    }
  }
}

void DeviceBackend::link_down(int src, bool graceful, const Status& why) {
  frame_in_[static_cast<size_t>(src)].clear();
  if (graceful) {
    // The rank finalized: what it launched runs to its end (each rank's part completes
    // with the collective), but nothing new can run on a communicator that spans it.
    if (!sticky_.is_ok()) return;
    sticky_ = {Code::PeerLost, "rank " + std::to_string(src) + " finalized; the device communicator spans it"};
    std::vector<uint64_t> unordered;
    for (const auto& [key, e] : ops_) {
      if (!e.ordered) unordered.push_back(e.tag);
    }
    for (uint64_t tag : unordered) finish(tag, sticky_);
    return;
  }
  // NCCL would wait for the rank forever: every device op fails instead, and the
  // communicator is aborted (once one exists, it spans every rank).
  fail_device({Code::PeerLost, "rank " + std::to_string(src) + " was lost: " + why.message()}, false);
}

}  // namespace taiji
