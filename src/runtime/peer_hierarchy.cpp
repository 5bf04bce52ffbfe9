// The hierarchical device allreduce at post (runtime/device_hierarchy.h): which ops take
// it, the lazily made child jobs, and the parent's request and name around the chain.
#include <algorithm>
#include <chrono>

#include "runtime/device_hierarchy.h"
#include "runtime/peer.h"

namespace taiji {

std::shared_ptr<DeviceHierarchy> Peer::hierarchy_now() const {
  std::lock_guard<std::mutex> lock(hierarchy_mu_);
  return hierarchy_;
}

Result<std::shared_ptr<DeviceHierarchy>> Peer::device_hierarchy() {
  auto made = [this]() -> Result<std::shared_ptr<DeviceHierarchy>> {
    std::lock_guard<std::mutex> lock(hierarchy_mu_);
    if (hierarchy_) return hierarchy_;
    if (!hierarchy_error_.is_ok()) return hierarchy_error_;
    return std::shared_ptr<DeviceHierarchy>();
  };
  if (auto h = made(); !h.is_ok() || h.value()) return h;
  if (on_io_thread()) {
    return Status{Code::InvalidArgument,
                  "the first hierarchical device allreduce makes the per-host jobs (a split, which blocks): "
                  "not from a completion callback"};
  }
  std::lock_guard<std::mutex> making(hierarchy_make_mu_);
  if (auto h = made(); !h.is_ok() || h.value()) return h;
  auto created = DeviceHierarchy::create(
      *this, membership_.snapshot()->host_of, config_.timeout_ms,
      [this](void* dst, const void* src, uint64_t bytes, bool to_device, int ordinal, void* stream) {
        return device_->copy(dst, src, bytes, to_device, ordinal, stream);
      });
  std::lock_guard<std::mutex> lock(hierarchy_mu_);
  if (!created.is_ok()) {
    // The ranks may now disagree on how far the splits got: no second try.
    hierarchy_error_ = created.status();
    return hierarchy_error_;
  }
  hierarchy_ = std::shared_ptr<DeviceHierarchy>(std::move(created.value()));
  return hierarchy_;
}

Result<std::shared_ptr<RequestState>> Peer::post_hierarchical(PostArgs args) {
  if (args.name.rfind("taiji.", 0) == 0) {
    return Status{Code::InvalidArgument, "op names starting with 'taiji.' are reserved"};
  }
  auto cluster = membership_.snapshot();
  const auto& host_of = cluster->host_of;
  const bool one_host = std::all_of(host_of.begin(), host_of.end(), [&](int h) { return h == host_of.front(); });
  // One host: NCCL's own allreduce is the whole of it. Host buffers: the host strategy of
  // that name.
  if (one_host || host_of.size() != static_cast<size_t>(size())) return poster_.post(std::move(args));
  if (Status s = poster_.check_args(args); !s.is_ok()) return s;
  PostedOp placed;
  if (Status s = device_->place(args, placed); !s.is_ok()) return s;
  if (!placed.device) return poster_.post(std::move(args));
  if (in_group()) {
    return Status{Code::InvalidArgument, "a hierarchical device allreduce cannot be held in a group"};
  }
  if (closed()) return Status{Code::Finalized, "peer is finalized or aborted"};
  auto h = device_hierarchy();
  if (!h.is_ok()) return h.status();
  auto version = names_.reserve(args.name, args.version);
  if (!version.is_ok()) return version.status();
  auto request = std::make_shared<RequestState>(version.value(), std::move(args.callback));
  const int64_t timeout_ms = args.timeout_ms > 0 ? args.timeout_ms : config_.timeout_ms;

  DeviceHierarchy::Op op;
  op.name = args.name;
  op.version = version.value();
  op.send = args.send;
  op.recv = args.recv;
  op.count = args.count;
  op.dtype = args.dtype;
  op.redop = args.redop;
  op.stream = args.stream;
  op.ordinal = placed.ordinal;
  op.deadline = DeviceHierarchy::Clock::now() + std::chrono::milliseconds(timeout_ms);
  op.finish = [this, name = args.name, v = version.value(), request](const Status& s) {
    // Completed on this peer's I/O thread, where user callbacks run.
    auto done = [this, name, v, request, s] {
      names_.release(name, v);
      request->complete(s);
    };
    if (!run_on_loop(done)) done();
  };
  if (Status s = h.value()->start(std::move(op)); !s.is_ok()) {
    names_.unreserve(args.name, version.value());
    return s;
  }
  return request;
}

}  // namespace taiji
