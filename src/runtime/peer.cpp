#include "runtime/peer.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "bootstrap/etcd_store.h"
#include "bootstrap/store_open.h"
#include "monitor/log.h"
#include "runtime/device_hierarchy.h"
#include "runtime/elastic_keys.h"
#include "runtime/p2p_key.h"

namespace taiji {

namespace {

// A graceful close that cannot flush its queued writes in this long closes hard.
constexpr uint64_t kCloseGraceMs = 2000;

int64_t remaining_ms(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::max<int64_t>(left.count(), 1);
}

}  // namespace

Peer::Peer(const Config& config)
    : config_(config),
      membership_(config_.rank, config_.size, config_.cluster_version),
      io_(config_.progress == "adaptive", config_.spin_us),
      poster_(config_, &membership_, &io_, &names_, [this] { return closed(); }) {
  // The level is the process's: only a peer told to set it does.
  if (!config_.log_level.empty()) set_log_level(config_.log_level);
  metrics_ = std::make_unique<Metrics>(config_.rank, config_.size,
                                       static_cast<size_t>(config_.flight_recorder_size));
  metrics_->set_enabled(config_.metrics == 1);

  TcpOptions to;
  to.cluster = &membership_.current();
  to.job_id = config_.job_id;
  to.listen_host = config_.listen_host;
  // Point-to-point ops travel under their caller's name and the pair (runtime/p2p_key.h).
  to.limits.max_name_len = static_cast<uint16_t>(
      std::min<uint64_t>(uint64_t{config_.max_name_len} + kP2pKeyOverhead, UINT16_MAX));
  to.limits.max_payload = config_.max_payload;
  to.secret = config_.secret;
  to.congestion = config_.tcp_congestion;
  to.handshake_timeout_ms = static_cast<uint64_t>(config_.handshake_timeout_ms);
  to.max_pending_connections = static_cast<int>(config_.max_pending_connections);
  to.link_counters = metrics_->link_counters();
  to.refusals = metrics_->refusal_counters();
  ShmOptions so;
  so.cluster = &membership_.current();
  so.limits = to.limits;
  so.ring_bytes = config_.shm_ring_bytes;
  so.enabled = config_.shm != "off";
  so.link_counters = to.link_counters;
  so.request_poll = [this] { io_.run_on_loop([this] { transports_->poll(); }); };

  HostBackendOptions ho;
  ho.engine.metrics = metrics_.get();
  ho.engine.cluster = &membership_.current();
  ho.engine.eager_bytes = config_.eager_bytes;
  ho.engine.unexpected_bytes = config_.unexpected_bytes;
  ho.engine.stall_warn_ms = static_cast<uint64_t>(config_.stall_warn_ms);
  ho.engine.held = [this](const std::string& name, uint64_t version) { return poster_.holds(name, version); };
  ho.fuse = config_.fusion == 1 && config_.size > 1;
  ho.fusion.cluster = &membership_.current();
  ho.fusion.max_op_bytes = config_.fusion_max_op_bytes;
  ho.fusion.buffer_bytes = config_.fusion_buffer_bytes;
  ho.fusion.chunk_bytes = std::min<uint64_t>(config_.chunk_bytes, config_.max_payload - 8);
  ho.fusion.round_timeout_ms = static_cast<uint64_t>(config_.timeout_ms);
  ho.fusion.metrics = metrics_.get();
  ho.eager_bytes = config_.eager_bytes;
  ho.bind = [this](PostedOp& op) { poster_.bind(op); };
  ho.bind_by_size = [this](PostedOp& op) { poster_.bind_by_size(op); };

  // The services are built before the transports deliver to them, and they before they send.
  host_ = std::make_unique<HostBackend>(std::move(ho), &io_, &names_);
  DeviceBackendOptions dopt;
  dopt.load.mode = config_.nccl == "off"  ? DeviceLoadOptions::Mode::Off
                   : config_.nccl == "on" ? DeviceLoadOptions::Mode::On
                                          : DeviceLoadOptions::Mode::Auto;
  dopt.load.nccl_library = config_.nccl_library;
  dopt.rank = config_.rank;
  dopt.size = config_.size;
  dopt.init_timeout_ms = config_.init_timeout_ms;
  device_ = std::make_unique<DeviceBackend>(std::move(dopt), &io_, &names_);
  probes_ = std::make_unique<RttProbes>(config_.rank, config_.size, metrics_.get());
  prober_ = std::make_unique<LinkProber>(config_.rank, config_.size, config_.link_probe_rate,
                                         config_.link_probe_bytes, metrics_.get());
  models_ = std::make_unique<ModelStore>(static_cast<uint64_t>(config_.model_store_versions),
                                         config_.model_store_bytes);
  // Replies in the ops' chunks: the shared-memory ring holds four of them, and a frame
  // larger than the ring would go over TCP.
  model_service_ = std::make_unique<ModelService>(
      config_.rank, config_.size, models_.get(),
      std::min<uint64_t>(config_.chunk_bytes, config_.max_payload));
  host_->engine().serve(router_);
  device_->serve(router_);
  probes_->serve(router_);
  prober_->serve(router_);
  model_service_->serve(router_);
  transports_ = std::make_unique<TransportStack>(io_.uv(), to, so, &router_);
  host_->set_transports(transports_.get());
  device_->set_transport(&transports_->top());
  probes_->set_transport(&transports_->top());
  prober_->set_transport(&transports_->top());
  model_service_->set_transport(&transports_->top());
  host_->engine().set_link_lost_handler(
      [this](int rank, const Status& why) { membership_.link_lost(rank, why); });
  // A lost rank ends this membership's work: the error stays until taiji_shrink replaces
  // the peer (runtime/elastic.h), which reads the ranks gone.
  // A rank that finalized has left as much as a lost one, for a shrink's count.
  host_->engine().set_departed_handler([this](int rank) {
    std::lock_guard<std::mutex> lock(state_mu_);
    departed_.insert(rank);
  });
  membership_.set_loss_policy([this](int rank, const Status& why) {
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      lost_.insert(rank);
    }
    set_error(why);
    host_->fail_all(why);
    device_->fail_all(why);
  });
  host_->engine().set_timeout_handler([this](const Status& s) { dump_flight_recorder(s); });
  io_.set_transports(transports_.get());
  // Device memory first: the host backend takes every op.
  poster_.add_backend(device_.get());
  poster_.add_backend(host_.get());
  poster_.set_placer([this](const PostArgs& args, PostedOp& op) { return device_->place(args, op); });
  // The transports read the cluster in place: they refuse the old version at once.
  membership_.add_listener(host_.get());
  membership_.add_listener(&poster_);
  membership_.add_listener(this);
}

Result<std::unique_ptr<Peer>> Peer::create(const Config& config,
                                           std::unique_ptr<RendezvousServer> served,
                                           std::unique_ptr<RendezvousServer>* served_back) {
  std::unique_ptr<Peer> peer(new Peer(config));
  peer->rendezvous_server_ = std::move(served);
  Status s = peer->bootstrap();
  if (!s.is_ok()) {
    if (served_back != nullptr) *served_back = std::move(peer->rendezvous_server_);
    return s;
  }
  return peer;
}

Status Peer::rendezvous(const std::string& self, std::chrono::steady_clock::time_point deadline) {
  const int size = membership_.size();
  std::vector<std::string> addresses(static_cast<size_t>(size));
  std::vector<std::string> labels(static_cast<size_t>(size), config_.host_label);
  if (size > 1) {
    auto client = open_store(config_.rendezvous, remaining_ms(deadline));
    if (!client.is_ok()) return client.status();
    // Each peer publishes "address\nhost label": where to dial it, and whom it shares a host with.
    std::string prefix = rendezvous_prefix(config_.job_id, membership_.version());
    Status s = client.value()->set(prefix + std::to_string(rank()),
                                   self + "\n" + config_.host_label, remaining_ms(deadline));
    if (!s.is_ok()) return s;
    for (int r = 0; r < size; ++r) {
      auto value = client.value()->get(prefix + std::to_string(r), remaining_ms(deadline));
      if (!value.is_ok()) {
        return {value.status().code() == Code::Timeout ? Code::Timeout : Code::Bootstrap,
                "rank " + std::to_string(r) + " did not publish its address: " +
                    value.status().message()};
      }
      auto newline = value.value().find('\n');
      addresses[r] = value.value().substr(0, newline);
      labels[r] = newline == std::string::npos ? addresses[r] : value.value().substr(newline + 1);
    }
  }
  // Hosts are numbered by first appearance in rank order, the same on every peer.
  std::vector<std::string> hosts;
  std::vector<int> host_of;
  for (const std::string& label : labels) {
    auto at = std::find(hosts.begin(), hosts.end(), label);
    host_of.push_back(static_cast<int>(at - hosts.begin()));
    if (at == hosts.end()) hosts.push_back(label);
  }
  membership_.set_addresses(std::move(addresses), std::move(host_of));
  return {};
}

Status Peer::bootstrap() {
  // TAIJI_NCCL=on: a job that demands GPUs does not start without them.
  if (config_.nccl == "on") {
    if (Status s = device_->usable(); !s.is_ok()) return {Code::Config, "TAIJI_NCCL=on: " + s.message()};
  }
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(config_.init_timeout_ms);
  std::string self;
  if (size() > 1) {
    if (config_.host_rendezvous == 1) {
      if (EtcdStore::is_etcd_address(config_.rendezvous)) {
        return {Code::Config, "TAIJI_RENDEZVOUS_HOST=1, but the rendezvous store is etcd (" +
                                  config_.rendezvous + "), which serves itself"};
      }
      std::string host;
      uint16_t port = 0;
      Status s = parse_host_port(config_.rendezvous, &host, &port);
      if (!s.is_ok()) return s;
      auto server = RendezvousServer::start(host, port);
      if (!server.is_ok()) return server.status();
      rendezvous_server_ = std::move(server.value());
    }
    auto listening = transports_->listen();
    if (!listening.is_ok()) return listening.status();
    self = listening.value();
  }
  if (Status s = rendezvous(self, deadline); !s.is_ok()) return s;
  note_cluster(membership_.current());
  poster_.cluster_ready();
  if (!config_.topology.empty()) {
    if (Status s = poster_.set_default_topology(config_.topology); !s.is_ok()) return s;
  }
  if (!config_.metrics_addr.empty()) {
    Status s = start_metrics_server();
    if (!s.is_ok()) return s;
  }
  io_.start([this] { on_tick(); }, [this] { return busy(); });
  if (size() == 1) return {};
  Status connected = connect_links(deadline);
  // Not before: a probe sent while the links were still being set up (the shared-memory
  // handshake among them) was seen to hold back every later frame of its mailbox.
  if (connected.is_ok()) run_on_loop([this] { prober_->start(); });
  return connected;
}

Status Peer::connect_links(std::chrono::steady_clock::time_point deadline) {
  auto connected = std::make_shared<std::promise<Status>>();
  auto result = connected->get_future();
  uint64_t left = static_cast<uint64_t>(remaining_ms(deadline));
  const Cluster& c = membership_.current();
  run_on_loop([this, addresses = c.addresses, host_of = c.host_of, left, connected] {
    transports_->connect(addresses, host_of, left, [connected](const Status& s) { connected->set_value(s); });
  });
  // connect reports by its own deadline; the extra second only guards against a loop
  // that stopped underneath us.
  if (result.wait_for(std::chrono::milliseconds(left + 1000)) != std::future_status::ready) {
    return {Code::Timeout, "connection set-up did not finish"};
  }
  Status s = result.get();
  if (s.is_ok()) log().debug("rank {} of {} connected", rank(), size());
  return s;
}

void Peer::note_cluster(const Cluster& now) {
  io_.set_one_host(std::all_of(now.host_of.begin(), now.host_of.end(), [](int h) { return h == 0; }));
  metrics_->set_gauge("taiji_cluster_version", {}, now.version,
                      "The version of this peer's membership: it rises with every change.");
}

void Peer::cluster_changed(const Cluster&, const Cluster& now) { note_cluster(now); }

Status Peer::change_membership(Cluster next) {
  if (on_io_thread()) {
    return {Code::InvalidArgument, "a membership change waits; it cannot run from a completion callback"};
  }
  auto changed = std::make_shared<std::promise<Status>>();
  auto result = changed->get_future();
  if (!run_on_loop([this, next = std::move(next), changed]() mutable {
        changed->set_value(membership_.change(std::move(next)));
      })) {
    return {Code::Finalized, "peer is finalized or aborted"};
  }
  if (result.wait_for(std::chrono::milliseconds(config_.timeout_ms)) != std::future_status::ready) {
    return {Code::Timeout, "the membership change did not run on the I/O thread in time"};
  }
  return result.get();
}

Peer::~Peer() {
  {
    // First: its children's callbacks complete this peer's requests.
    std::shared_ptr<DeviceHierarchy> h;
    {
      std::lock_guard<std::mutex> lock(hierarchy_mu_);
      h = std::move(hierarchy_);
    }
  }
  poster_.fail_groups({Code::Aborted, "peer destroyed while the op's group was still open"});
  if (io_.running()) {
    bool was_closing;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      was_closing = closing_;
      closing_ = true;
    }
    // Never finalized: ops still running are aborted, but the links close with a Bye,
    // so the other peers see a departure, not a crash.
    if (!was_closing) run_on_loop([this] { begin_close(CloseMode::Destroy); });
    io_.join();
  } else if (!io_.joined()) {
    // The loop never ran: close its handles here, on the only thread that touches it.
    begin_close(CloseMode::Abort);
    io_.run_here();
  }
}

Status Peer::finalize() { return finalize_within(config_.timeout_ms); }

Status Peer::finalize_within(int64_t wait_ms) {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    closing_ = true;
  }
  poster_.fail_groups({Code::Finalized, "peer finalized while the op's group was still open"});
  // Hierarchical allreduces end before this peer stops running their completions.
  if (auto h = hierarchy_now()) h->finalize(wait_ms);
  // Both are idempotent: a second or concurrent finalize just waits for the same end.
  run_on_loop([this, wait_ms] { begin_close(CloseMode::Finalize, wait_ms); });
  io_.join();
  return async_error();
}

std::set<int> Peer::gone_ranks() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  std::set<int> gone = lost_;
  gone.insert(departed_.begin(), departed_.end());
  return gone;
}

void Peer::forget_departures() {
  std::lock_guard<std::mutex> lock(state_mu_);
  departed_.clear();
}

void Peer::fail(const Status& why) { set_error(why); }

std::unique_ptr<RendezvousServer> Peer::release_services() {
  metrics_server_.reset();
  return std::move(rendezvous_server_);
}

void Peer::abort() {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    closing_ = true;
    if (sticky_.is_ok()) sticky_ = {Code::Aborted, "peer aborted"};
  }
  poster_.fail_groups({Code::Aborted, "peer aborted while the op's group was still open"});
  if (auto h = hierarchy_now()) h->abort();
  run_on_loop([this] { begin_close(CloseMode::Abort); });
}

bool Peer::closed() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return closing_;
}

Status Peer::async_error() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return sticky_;
}

void Peer::set_error(const Status& s) {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (sticky_.is_ok()) sticky_ = s;
}

void Peer::begin_close(CloseMode mode, int64_t wait_ms) {
  if (mode == CloseMode::Abort) {
    host_->fail_all({Code::Aborted, "peer aborted"});
    device_->fail_all({Code::Aborted, "peer aborted"});
    close_links(false);
    // The links stopped reading: no reply writes into a requester's buffer any more.
    model_service_->close({Code::Aborted, "peer aborted with the model request in flight"});
    return;
  }
  if (finalizing_ || closing_links_) return;
  finalizing_ = true;
  uint64_t wait = mode == CloseMode::Finalize ? static_cast<uint64_t>(std::max<int64_t>(wait_ms, 0)) : 0;
  close_deadline_ = uv_now(io_.uv()) + wait;
  on_tick();
}

void Peer::on_tick() {
  host_->tick();
  device_->tick();
  model_service_->tick(uv_now(io_.uv()));
  // A credit from a rank this one does not read now is never delivered.
  transports_->tick();
  metrics_->sample_links(monotonic_ns());
  const uint64_t now = uv_now(io_.uv());
  if (finalizing_ || closing_links_) prober_->stop();
  prober_->tick(now);
  if (finalizing_ && (ops_idle() || now >= close_deadline_)) {
    finalizing_ = false;
    host_->fail_all({Code::Aborted, "peer closed with the op still in flight"});
    device_->fail_all({Code::Aborted, "peer closed with the device op still in flight"});
    close_links(true);
  } else if (closing_links_ && now >= close_deadline_) {
    transports_->close_now([this] { on_links_closed(); });
  }
}

void Peer::close_links(bool graceful) {
  if (closing_links_ && graceful) return;
  finalizing_ = false;
  closing_links_ = true;
  close_deadline_ = uv_now(io_.uv()) + kCloseGraceMs;
  if (graceful) {
    transports_->shutdown([this] { on_links_closed(); });
  } else {
    transports_->close_now([this] { on_links_closed(); });
  }
}

void Peer::on_links_closed() {
  io_.refuse_work();
  host_->links_closed();
  device_->links_closed();
  model_service_->close({Code::Finalized, "peer finalized with the model request in flight"});
  // Ops posted just before the close, or held back by a topology change, still complete
  // (with an error), never vanish.
  io_.drain();
  poster_.open_gate();
  io_.close_handles();
}

}  // namespace taiji
