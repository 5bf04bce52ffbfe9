#include "runtime/device_hierarchy.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <vector>

#include "collectives/reduce_kernels.h"
#include "monitor/log.h"
#include "runtime/peer.h"

namespace taiji {

namespace {

// taiji_memory_t's values (include/taiji/taiji.h).
constexpr int kMemoryHost = 1;
constexpr int kMemoryDevice = 2;

int64_t ms_left(DeviceHierarchy::Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - DeviceHierarchy::Clock::now());
  return left.count();
}

}  // namespace

struct DeviceHierarchy::Flight {
  Op op;
  std::vector<uint8_t> staging;  // the leader's host copy
  std::atomic<bool> ended{false};
  std::string label() const { return "hierarchical allreduce '" + op.name + "' version " + std::to_string(op.version); }
};

Result<std::unique_ptr<DeviceHierarchy>> DeviceHierarchy::create(Peer& parent, const std::vector<int>& host_of,
                                                                 int64_t timeout_ms, Copy copy) {
  const int me = parent.rank();
  if (static_cast<int>(host_of.size()) != parent.size() || me < 0 || me >= parent.size()) {
    return Status{Code::Internal, "hierarchical allreduce: the host map does not fit the job"};
  }
  const int host = host_of[static_cast<size_t>(me)];
  int lowest = me;
  for (int r = 0; r < me; ++r) {
    if (host_of[static_cast<size_t>(r)] == host) {
      lowest = r;
      break;
    }
  }
  // Both splits are collectives of the parent, made in this order by every rank.
  auto local = parent.split(host, me, timeout_ms);
  if (!local.is_ok()) {
    return Status{local.status().code(), "hierarchical allreduce: the per-host job: " + local.status().message()};
  }
  auto leaders = parent.split(lowest == me ? 0 : -1, me, timeout_ms);
  if (!leaders.is_ok()) {
    return Status{leaders.status().code(),
                  "hierarchical allreduce: the job of host leaders: " + leaders.status().message()};
  }
  log().debug("rank {} of {}: hierarchical allreduce: rank {} of {} on host {}{}", me, parent.size(),
              local.value()->rank(), local.value()->size(), host, lowest == me ? ", its leader" : "");
  return std::unique_ptr<DeviceHierarchy>(new DeviceHierarchy(std::move(local.value()), std::move(leaders.value()),
                                                              parent.size(), std::move(copy)));
}

DeviceHierarchy::DeviceHierarchy(std::unique_ptr<Peer> local, std::unique_ptr<Peer> leaders, int world, Copy copy)
    : local_(std::move(local)), leaders_(std::move(leaders)), world_(world), copy_(std::move(copy)) {}

DeviceHierarchy::~DeviceHierarchy() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  // Chains in flight fail with the children's ops (nothing is posted once closing); the
  // children's I/O threads are joined here, so no callback outlives this object.
  leaders_.reset();
  local_.reset();
}

int DeviceHierarchy::local_size() const { return local_->size(); }

Status DeviceHierarchy::start(Op op) {
  auto f = std::make_shared<Flight>();
  f->op = std::move(op);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return {Code::Finalized, "peer is finalized or aborted"};
    ++in_flight_;
  }
  Status s = post_stage(f, *local_, static_cast<int>(OpKind::Reduce), ".reduce", true);
  if (!s.is_ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_;
    }
    idle_.notify_all();
    return s;
  }
  return {};
}

Status DeviceHierarchy::post_stage(const std::shared_ptr<Flight>& f, Peer& child, int kind, const char* suffix,
                                   bool device) {
  const Op& op = f->op;
  const int64_t left = ms_left(op.deadline);
  if (left <= 0) return {Code::Timeout, "past its deadline before its " + std::string(suffix + 1) + " stage"};
  PostArgs a;
  a.kind = static_cast<OpKind>(kind);
  a.name = op.name + ".h" + std::to_string(op.version) + suffix;
  if (a.name.size() > child.config().max_name_len) {
    uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a of the readable form
    for (unsigned char c : a.name) h = (h ^ c) * 0x100000001b3ULL;
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
    a.name = std::string(hex) + suffix;
  }
  a.count = op.count;
  a.dtype = op.dtype;
  // Avg sums on the way; the leader divides once the leaders have summed.
  a.redop = op.redop == RedOp::Avg ? RedOp::Sum : op.redop;
  a.root = 0;
  a.timeout_ms = left;
  if (device) {
    a.memory = kMemoryDevice;
    a.stream = op.stream;
    a.send = a.kind == OpKind::Broadcast ? op.recv : op.send;
    a.recv = op.recv;
  } else {
    a.memory = kMemoryHost;
    a.send = f->staging.data();
    a.recv = f->staging.data();
  }
  const bool reduce = a.kind == OpKind::Reduce;
  const bool bcast = a.kind == OpKind::Broadcast;
  a.callback = [this, f, reduce, bcast](const Status& s) {
    if (reduce) {
      reduced(f, s);
    } else if (bcast) {
      end(f, s.is_ok() ? s : Status{s.code(), f->label() + ": the broadcast within the host: " + s.message()});
    } else {
      exchanged(f, s);
    }
  };
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return {Code::Finalized, "peer is finalized or aborted"};
  auto posted = child.post(std::move(a));
  return posted.status();
}

void DeviceHierarchy::reduced(const std::shared_ptr<Flight>& f, const Status& s) {
  if (!s.is_ok()) return end(f, {s.code(), f->label() + ": the reduce within the host: " + s.message()});
  if (!leaders_) return broadcast(f);
  const Op& op = f->op;
  const uint64_t bytes = op.count * dtype_size(op.dtype);
  // The copy waits for the device; short, on this child's I/O thread.
  f->staging.resize(bytes);
  if (Status c = copy_(f->staging.data(), op.recv, bytes, false, op.ordinal, op.stream); !c.is_ok()) {
    return end(f, {c.code(), f->label() + ": the copy to the host: " + c.message()});
  }
  Status p = post_stage(f, *leaders_, static_cast<int>(OpKind::Allreduce), ".leaders", false);
  if (!p.is_ok()) end(f, {p.code(), f->label() + ": the allreduce between hosts: " + p.message()});
}

void DeviceHierarchy::exchanged(const std::shared_ptr<Flight>& f, const Status& s) {
  if (!s.is_ok()) return end(f, {s.code(), f->label() + ": the allreduce between hosts: " + s.message()});
  const Op& op = f->op;
  if (op.redop == RedOp::Avg) finish_average(op.dtype, f->staging.data(), op.count, world_);
  if (Status c = copy_(op.recv, f->staging.data(), f->staging.size(), true, op.ordinal, op.stream); !c.is_ok()) {
    return end(f, {c.code(), f->label() + ": the copy to the device: " + c.message()});
  }
  broadcast(f);
}

void DeviceHierarchy::broadcast(const std::shared_ptr<Flight>& f) {
  Status p = post_stage(f, *local_, static_cast<int>(OpKind::Broadcast), ".bcast", true);
  if (!p.is_ok()) end(f, {p.code(), f->label() + ": the broadcast within the host: " + p.message()});
}

void DeviceHierarchy::end(const std::shared_ptr<Flight>& f, const Status& s) {
  if (f->ended.exchange(true)) return;
  f->staging.clear();
  f->staging.shrink_to_fit();
  auto finish = std::move(f->op.finish);
  if (finish) finish(s);
  {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
  }
  idle_.notify_all();
}

void DeviceHierarchy::finalize(int64_t wait_ms) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(wait_ms, 0)), [this] { return in_flight_ == 0; });
    closing_ = true;
  }
  if (leaders_) (void)leaders_->finalize_within(wait_ms);
  (void)local_->finalize_within(wait_ms);
}

void DeviceHierarchy::abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  if (leaders_) leaders_->abort();
  local_->abort();
}

}  // namespace taiji
