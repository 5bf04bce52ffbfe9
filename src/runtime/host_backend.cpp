#include "runtime/host_backend.h"

#include <algorithm>

namespace taiji {

namespace {

// The larger of an op's send and receive buffers.
uint64_t op_bytes(const CollectiveSpec& spec) {
  return std::max(send_elements(spec), recv_elements(spec)) * dtype_size(spec.dtype);
}

}  // namespace

HostBackend::HostBackend(HostBackendOptions options, IoLoop* io, NameTable* names)
    : opt_(std::move(options)), io_(io) {
  engine_ = std::make_unique<OpEngine>(io_->uv(), opt_.engine, names);
  if (!opt_.fuse) return;
  FusionHooks hooks;
  hooks.bind_internal = opt_.bind_by_size;
  hooks.start = [this](PostedOp op) { engine_->start(std::move(op)); };
  // Only ops posted on the automatic topology are fused: one that leaves fusion keeps
  // it, whatever the topology has become since.
  hooks.start_unfused = [this](PostedOp op) {
    opt_.bind_by_size(op);
    engine_->start(std::move(op));
  };
  hooks.defer = [this](std::function<void()> fn) { io_->run_on_loop(std::move(fn)); };
  hooks.has_early = [this](const std::string& name, uint64_t version) {
    return engine_->has_early(name, version);
  };
  fusion_ = std::make_unique<Fusion>(opt_.fusion, std::move(hooks), names);
}

HostBackend::~HostBackend() = default;

void HostBackend::set_transports(TransportStack* transports) {
  transports_ = transports;
  engine_->set_transport(&transports_->top());
}

void HostBackend::start(std::shared_ptr<PostedOp> op, bool fusable) {
  if (fusable && fusion_ && fusion_->offer(*op)) return;
  opt_.bind(*op);
  // Only counted where it matters: a loop with peers on other hosts sleeps while one runs.
  if (io_->adaptive() && !io_->one_host() && op_bytes(op->spec) > opt_.eager_bytes) {
    io_->large_op_began();
    op->finish_hook = [this, inner = std::move(op->finish_hook)](const Status& st) {
      io_->large_op_ended();
      return inner ? inner(st) : st;
    };
  }
  // The op's Ready and first Data frames to a peer leave in one write.
  transports_->cork();
  engine_->start(std::move(*op));
  transports_->uncork();
}

void HostBackend::tick() {
  engine_->tick();
  if (fusion_) fusion_->tick();
}

void HostBackend::fail_all(const Status& why) {
  engine_->fail_all(why);
  if (fusion_) fusion_->fail_all(why);
}

void HostBackend::links_closed() {
  engine_->transport_closed();
  if (fusion_) fusion_->fail_all({Code::Finalized, "peer closed"});
}

}  // namespace taiji
