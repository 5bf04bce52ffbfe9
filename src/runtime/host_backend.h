// The host-memory backend: an op runs as a collective state machine (collectives/) over
// the transports, matched and timed by the op engine; small allreduces on the automatic
// topology may be fused first (runtime/fusion.h).
#pragma once

#include <functional>
#include <memory>

#include "runtime/backend.h"
#include "runtime/fusion.h"
#include "runtime/io_loop.h"
#include "runtime/op_engine.h"
#include "transport/transport_stack.h"

namespace taiji {

struct HostBackendOptions {
  EngineOptions engine;
  FusionOptions fusion;
  bool fuse = false;
  uint64_t eager_bytes = 64 << 10;
  // Gives an op its graphs: the topology in force, or by size.
  std::function<void(PostedOp&)> bind;
  // Gives an op its graphs by size alone, whatever the topology (fusion's ops).
  std::function<void(PostedOp&)> bind_by_size;
};

class HostBackend final : public Backend, public ClusterListener {
 public:
  HostBackend(HostBackendOptions options, IoLoop* io, NameTable* names);
  ~HostBackend() override;
  // Before the loop runs: what ops send through (built after the engine they deliver to).
  void set_transports(TransportStack* transports);

  OpEngine& engine() { return *engine_; }

  bool accepts(const PostedOp&) const override { return true; }
  void start(std::shared_ptr<PostedOp> op, bool fusable) override;
  bool idle() const override { return engine_->idle() && (!fusion_ || fusion_->idle()); }
  void tick() override;
  void fail_all(const Status& why) override;
  void links_closed() override;
  void cluster_changed(const Cluster& before, const Cluster& now) override {
    engine_->cluster_changed(before, now);
  }

 private:
  HostBackendOptions opt_;
  IoLoop* io_;
  TransportStack* transports_ = nullptr;
  std::unique_ptr<OpEngine> engine_;
  std::unique_ptr<Fusion> fusion_;  // null: fusion off
};

}  // namespace taiji
