#include "runtime/peer.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "monitor/log.h"
#include "transport/sigpipe.h"

namespace taiji {

namespace {

constexpr uint64_t kTickMs = 20;
// More than this read in one loop round is a bulk transfer. From another host the next
// data then comes at the link's pace: a wake-up costs little next to waiting for it, and
// a polling thread would only burn CPU time (twice the CPU per op, measured on the
// emulated 1 Gbit/s cluster). Peers on this host answer within microseconds, so a job
// with every rank on one host keeps polling through bulk transfers and large ops: each
// hop of a pipelined chunk is a hand-over between loops, and sleeping added a wake-up to
// every one (1 MiB allreduce over shared memory 2-2.5x faster polling).
constexpr uint64_t kBulkReadBytes = 64 * 1024;
constexpr uint32_t kClusterVersion = 1;
// A graceful close that cannot flush its queued writes in this long closes hard.
constexpr uint64_t kCloseGraceMs = 2000;

int64_t remaining_ms(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::max<int64_t>(left.count(), 1);
}

}  // namespace

Peer::Peer(const Config& config)
    : config_(config), adaptive_(config_.progress == "adaptive" && config_.spin_us > 0) {
  set_log_level(config_.log_level);
  uv_loop_init(&loop_);
  uv_async_init(&loop_, &wake_, [](uv_async_t* a) { static_cast<Peer*>(a->data)->drain_inbox(); });
  wake_.data = this;
  uv_timer_init(&loop_, &tick_);
  tick_.data = this;
  if (adaptive_) {
    // The I/O thread parks for a quarter of the spin window at first: the most an op
    // posted without a waiter waits for it right after a waiter gave the loop back.
    LoopBaton::Driver* driver = this;
    baton_ = std::make_shared<LoopBaton>(driver, static_cast<uint64_t>(config_.spin_us) * 1000 / 4);
  }
  metrics_ = std::make_unique<Metrics>(config_.rank, config_.size,
                                       static_cast<size_t>(config_.flight_recorder_size));
  metrics_->set_enabled(config_.metrics == 1);
  EngineOptions eo;
  eo.metrics = metrics_.get();
  eo.rank = config_.rank;
  eo.size = config_.size;
  eo.eager_bytes = config_.eager_bytes;
  eo.unexpected_bytes = config_.unexpected_bytes;
  eo.stall_warn_ms = static_cast<uint64_t>(config_.stall_warn_ms);
  eo.held = [this](const std::string& name, uint64_t version) { return groups_.holds(name, version); };
  engine_ = std::make_unique<OpEngine>(&loop_, eo, &names_);
  engine_->set_fatal_handler([this](const Status& s) { set_error(s); });
  engine_->set_timeout_handler([this](const Status& s) { dump_flight_recorder(s); });
  engine_->serve(router_);
  probes_ = std::make_unique<RttProbes>(config_.rank, config_.size, metrics_.get());
  probes_->serve(router_);
  if (config_.fusion == 1 && config_.size > 1) {
    FusionOptions fo;
    fo.rank = config_.rank;
    fo.size = config_.size;
    fo.max_op_bytes = config_.fusion_max_op_bytes;
    fo.buffer_bytes = config_.fusion_buffer_bytes;
    fo.chunk_bytes = std::min<uint64_t>(config_.chunk_bytes, config_.max_payload - 8);
    fo.round_timeout_ms = static_cast<uint64_t>(config_.timeout_ms);
    fo.metrics = metrics_.get();
    FusionHooks hooks;
    hooks.bind_internal = [this](PostedOp& op) { bind_by_size(op); };
    hooks.start = [this](PostedOp op) { engine_->start(std::move(op)); };
    // Only ops posted on the automatic topology are fused: one that leaves fusion keeps
    // it, whatever the topology has become since.
    hooks.start_unfused = [this](PostedOp op) {
      bind_by_size(op);
      engine_->start(std::move(op));
    };
    hooks.defer = [this](std::function<void()> fn) { run_on_loop(std::move(fn)); };
    hooks.has_early = [this](const std::string& name, uint64_t version) {
      return engine_->has_early(name, version);
    };
    fusion_ = std::make_unique<Fusion>(fo, std::move(hooks), &names_);
  }
  TcpOptions to;
  to.rank = config_.rank;
  to.size = config_.size;
  to.cluster_version = kClusterVersion;
  to.job_id = config_.job_id;
  to.listen_host = config_.listen_host;
  to.limits.max_name_len = static_cast<uint16_t>(config_.max_name_len);
  to.limits.max_payload = config_.max_payload;
  to.secret = config_.secret;
  to.congestion = config_.tcp_congestion;
  to.handshake_timeout_ms = static_cast<uint64_t>(config_.handshake_timeout_ms);
  to.max_pending_connections = static_cast<int>(config_.max_pending_connections);
  to.link_counters = metrics_->link_counters();
  ShmOptions so;
  so.rank = config_.rank;
  so.size = config_.size;
  so.limits = to.limits;
  so.limits.cluster_version = kClusterVersion;
  so.ring_bytes = config_.shm_ring_bytes;
  so.enabled = config_.shm != "off";
  so.link_counters = to.link_counters;
  so.request_poll = [this] { run_on_loop([this] { shm_->poll(); }); };
  transport_ = std::make_unique<TcpTransport>(&loop_, to, nullptr);
  shm_ = std::make_unique<ShmTransport>(so, transport_.get(), &router_);
  transport_->set_handler(shm_.get());
  engine_->set_transport(shm_.get());
  probes_->set_transport(shm_.get());
}

Result<std::unique_ptr<Peer>> Peer::create(const Config& config) {
  std::unique_ptr<Peer> peer(new Peer(config));
  Status s = peer->bootstrap();
  if (!s.is_ok()) return s;
  return peer;
}

Status Peer::bootstrap() {
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(config_.init_timeout_ms);
  std::vector<std::string> addresses(config_.size);
  std::vector<std::string> labels(config_.size, config_.host_label);
  if (config_.size > 1) {
    if (config_.host_rendezvous == 1) {
      std::string host;
      uint16_t port = 0;
      Status s = parse_host_port(config_.rendezvous, &host, &port);
      if (!s.is_ok()) return s;
      auto server = RendezvousServer::start(host, port);
      if (!server.is_ok()) return server.status();
      rendezvous_server_ = std::move(server.value());
    }
    auto self = transport_->listen();
    if (!self.is_ok()) return self.status();
    auto client = RendezvousClient::connect(config_.rendezvous, remaining_ms(deadline));
    if (!client.is_ok()) return client.status();
    // Each peer publishes "address\nhost label": where to dial it, and whom it shares a host with.
    std::string prefix = config_.job_id + "/addr/";
    Status s = client.value()->set(prefix + std::to_string(config_.rank),
                                   self.value() + "\n" + config_.host_label, remaining_ms(deadline));
    if (!s.is_ok()) return s;
    for (int r = 0; r < config_.size; ++r) {
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
  for (const std::string& label : labels) {
    auto at = std::find(hosts.begin(), hosts.end(), label);
    host_of_.push_back(static_cast<int>(at - hosts.begin()));
    if (at == hosts.end()) hosts.push_back(label);
  }
  strategies_ = std::make_unique<StrategyCache>(config_.size, host_of_);
  one_host_ = std::all_of(host_of_.begin(), host_of_.end(), [](int h) { return h == 0; });
  if (!config_.topology.empty()) {
    auto configured = resolve_topology(config_.topology);
    if (!configured.is_ok()) return {Code::Config, configured.status().message()};
    current_ = configured.value();
  }
  if (!config_.metrics_addr.empty()) {
    Status s = start_metrics_server();
    if (!s.is_ok()) return s;
  }
  uv_timer_start(&tick_, [](uv_timer_t* t) { static_cast<Peer*>(t->data)->on_tick(); }, kTickMs, kTickMs);
  thread_ = std::thread([this] {
    io_thread_id_ = std::this_thread::get_id();
    // A write to a connection the peer just closed raises SIGPIPE in the writing thread;
    // blocked here, it stays pending and the write fails with EPIPE instead of killing
    // the process. A waiter running the loop blocks it too, while it does, from its first
    // write (drive(), transport/sigpipe.h).
    block_sigpipe_for_good();
    run_loop();
    if (baton_) baton_->close();
    run_deferred_callbacks();
    // A later thread may get this one's id: it must not pass for the I/O thread.
    io_thread_id_ = std::thread::id();
  });
  // Set before the first post can read it (with one rank nothing below waits for the loop).
  io_thread_id_ = thread_.get_id();
  if (config_.size == 1) return {};
  auto connected = std::make_shared<std::promise<Status>>();
  auto result = connected->get_future();
  uint64_t left = static_cast<uint64_t>(remaining_ms(deadline));
  run_on_loop([this, addresses, left, connected] {
    transport_->connect_all(addresses, left, [this, connected](const Status& s) {
      if (s.is_ok()) shm_->start(host_of_);
      connected->set_value(s);
    });
  });
  // connect_all reports by its own deadline; the extra second only guards against a
  // loop that stopped underneath us.
  if (result.wait_for(std::chrono::milliseconds(left + 1000)) != std::future_status::ready) {
    return {Code::Timeout, "connection set-up did not finish"};
  }
  Status s = result.get();
  if (s.is_ok()) log().debug("rank {} of {} connected", config_.rank, config_.size);
  return s;
}

Peer::~Peer() {
  fail_groups({Code::Aborted, "peer destroyed while the op's group was still open"});
  if (thread_.joinable()) {
    bool closing;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      closing = closing_;
      closing_ = true;
    }
    // Never finalized: ops still running are aborted, but the links close with a Bye,
    // so the other peers see a departure, not a crash.
    if (!closing) run_on_loop([this] { begin_close(CloseMode::Destroy); });
    stop_thread();
  } else if (!joined_) {
    // The loop never ran: close its handles here, on the only thread that touches it.
    begin_close(CloseMode::Abort);
    uv_run(&loop_, UV_RUN_DEFAULT);
  }
  uv_loop_close(&loop_);
}

bool Peer::run_on_loop(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    if (loop_closed_) return false;
    inbox_.push_back(std::move(fn));
    inbox_nonempty_.store(true, std::memory_order_relaxed);
  }
  wake_loop();
  return true;
}

void Peer::wake_loop() {
  if (!polling_.load()) uv_async_send(&wake_);
}

void Peer::drain_inbox() {
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    work.swap(inbox_);
    inbox_nonempty_.store(false, std::memory_order_relaxed);
  }
  if (work.empty()) return;
  ++drained_;
  for (auto& fn : work) fn();
}

void Peer::run_loop() {
  if (!adaptive_) {
    uv_run(&loop_, UV_RUN_DEFAULT);
    return;
  }
  SpinWindow window(static_cast<uint64_t>(config_.spin_us) * 1000);
  uint64_t seen = activity();
  uint64_t bytes = transport_->read_bytes();
  while (uv_run(&loop_, UV_RUN_ONCE) != 0) {
    // Woken by the tick alone: nothing suggests more traffic soon, so no polling.
    if (activity() == seen) continue;
    seen = activity();
    if (!paced_by_network(&bytes) && !poll(window, &seen, &bytes)) return;
  }
}

bool Peer::paced_by_network(uint64_t* bytes) {
  const uint64_t read = transport_->read_bytes();
  const bool bulk = read - *bytes > kBulkReadBytes;
  *bytes = read;
  return !one_host_ && (large_ops_ > 0 || bulk);
}

bool Peer::poll(SpinWindow& window, uint64_t* seen, uint64_t* bytes) {
  polling_.store(true);
  shm_->set_polling(true);
  bool alive = true;
  bool paid = false;
  uint64_t deadline = progress_now_ns() + window.ns();
  for (;;) {
    if (baton_->wanted()) {
      baton_->lend_and_park();
      run_deferred_callbacks();
      // The waiter left work, or stopped using the loop a while ago: poll a full window.
      paid = true;
      deadline = progress_now_ns() + window.ns();
    }
    if (inbox_nonempty_.load(std::memory_order_relaxed)) drain_inbox();
    if (uv_run(&loop_, UV_RUN_NOWAIT) == 0) {
      alive = false;
      break;
    }
    shm_->poll();
    if (paced_by_network(bytes)) break;
    uint64_t now = progress_now_ns();
    if (activity() != *seen) {
      *seen = activity();
      paid = true;
      window.paid();
      deadline = now + window.ns();
    } else if (now >= deadline) {
      break;
    }
    progress_pause();
  }
  if (!paid) window.missed();
  // Posters that saw polling_ set skipped the eventfd: their work is in the inbox now;
  // senders that saw the mailbox polled rang no doorbell: their frames are in it.
  shm_->set_polling(false);
  polling_.store(false);
  drain_inbox();
  shm_->poll();
  return alive;
}

bool Peer::drive(const std::atomic<bool>& done, uint64_t window_ns, uint64_t hard_ns) {
  // A write to a peer that just closed must fail with EPIPE, not kill the process.
  LazySigpipeBlock no_sigpipe;
  if (transport_->writes_queued()) no_sigpipe.block();
  DeferUserCallbacks defer(&deferred_);
  uint64_t seen = activity();
  uint64_t bytes = transport_->read_bytes();
  uint64_t deadline = std::min(progress_now_ns() + window_ns, hard_ns);
  for (;;) {
    if (inbox_nonempty_.load(std::memory_order_relaxed)) drain_inbox();
    if (done.load(std::memory_order_acquire)) break;
    if (uv_run(&loop_, UV_RUN_NOWAIT) == 0) return true;
    shm_->poll();
    if (done.load(std::memory_order_acquire) || paced_by_network(&bytes)) break;
    const uint64_t now = progress_now_ns();
    if (activity() != seen) {
      seen = activity();
      deadline = std::min(now + window_ns, hard_ns);
    } else if (now >= deadline) {
      break;
    }
    progress_pause();
  }
  return busy();
}

bool Peer::ops_idle() const {
  return engine_->idle() && (!fusion_ || fusion_->idle()) && !gate_ && gated_.empty();
}

bool Peer::busy() const {
  return inbox_nonempty_.load(std::memory_order_relaxed) || !deferred_.empty() || !ops_idle() ||
         finalizing_ || closing_links_;
}

void Peer::run_deferred_callbacks() {
  DeferredCallbacks work;
  work.swap(deferred_);
  for (auto& fn : work) fn();
}

Status Peer::finalize() {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    closing_ = true;
  }
  fail_groups({Code::Finalized, "peer finalized while the op's group was still open"});
  // Both are idempotent: a second or concurrent finalize just waits for the same end.
  run_on_loop([this] { begin_close(CloseMode::Finalize); });
  stop_thread();
  return async_error();
}

void Peer::abort() {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    closing_ = true;
    if (sticky_.is_ok()) sticky_ = {Code::Aborted, "peer aborted"};
  }
  fail_groups({Code::Aborted, "peer aborted while the op's group was still open"});
  run_on_loop([this] { begin_close(CloseMode::Abort); });
}

void Peer::stop_thread() {
  if (on_io_thread()) return;  // from a callback: no self-join
  std::lock_guard<std::mutex> lock(join_mu_);
  if (thread_.joinable()) thread_.join();
  joined_ = true;
}

bool Peer::on_io_thread() const { return io_thread_id() == std::this_thread::get_id(); }

Status Peer::async_error() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return sticky_;
}

void Peer::set_error(const Status& s) {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (sticky_.is_ok()) sticky_ = s;
}

void Peer::begin_close(CloseMode mode) {
  if (mode == CloseMode::Abort) {
    engine_->fail_all({Code::Aborted, "peer aborted"});
    if (fusion_) fusion_->fail_all({Code::Aborted, "peer aborted"});
    close_links(false);
    return;
  }
  if (finalizing_ || closing_links_) return;
  finalizing_ = true;
  uint64_t wait = mode == CloseMode::Finalize ? static_cast<uint64_t>(config_.timeout_ms) : 0;
  close_deadline_ = uv_now(&loop_) + wait;
  on_tick();
}

void Peer::on_tick() {
  engine_->tick();
  // A credit from a rank this one does not read now is never delivered.
  shm_->retry_waiting();
  if (fusion_) fusion_->tick();
  metrics_->sample_links(monotonic_ns());
  if (finalizing_ && (ops_idle() || uv_now(&loop_) >= close_deadline_)) {
    finalizing_ = false;
    engine_->fail_all({Code::Aborted, "peer closed with the op still in flight"});
    if (fusion_) fusion_->fail_all({Code::Aborted, "peer closed with the op still in flight"});
    close_links(true);
  } else if (closing_links_ && uv_now(&loop_) >= close_deadline_) {
    shm_->close_now([this] { on_links_closed(); });
  }
}

void Peer::close_links(bool graceful) {
  if (closing_links_ && graceful) return;
  finalizing_ = false;
  closing_links_ = true;
  close_deadline_ = uv_now(&loop_) + kCloseGraceMs;
  if (graceful) {
    shm_->shutdown([this] { on_links_closed(); });
  } else {
    shm_->close_now([this] { on_links_closed(); });
  }
}

void Peer::on_links_closed() {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    loop_closed_ = true;
  }
  engine_->transport_closed();
  if (fusion_) fusion_->fail_all({Code::Finalized, "peer closed"});
  // Ops posted just before the close, or held back by a topology change, still complete
  // (with an error), never vanish.
  drain_inbox();
  open_gate();
  uv_close(reinterpret_cast<uv_handle_t*>(&tick_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&wake_), nullptr);
}

}  // namespace taiji
