// A peer: one process's (or one thread's) membership in a job. It owns an I/O thread
// running a libuv loop; callers on any thread post work to it through a queue. "I/O
// thread only" here and in the runtime means "on the thread running the loop": the I/O
// thread, or a waiting caller it lent the loop to (runtime/loop_baton.h), never two at
// once. User callbacks run on the I/O thread itself.
#pragma once

#include <uv.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "monitor/http_server.h"
#include "monitor/metrics.h"
#include "runtime/config.h"
#include "runtime/fusion.h"
#include "runtime/loop_baton.h"
#include "runtime/name_table.h"
#include "runtime/op_engine.h"
#include "runtime/post_groups.h"
#include "runtime/progress.h"
#include "bootstrap/rendezvous.h"
#include "topology/selection.h"
#include "transport/shm_transport.h"
#include "transport/tcp_transport.h"

namespace taiji {

struct PostArgs {
  OpKind kind = OpKind::Allreduce;
  std::string name;
  uint64_t version = 0;           // 0: automatic
  const void* send = nullptr;
  void* recv = nullptr;
  uint64_t count = 0;
  DType dtype = DType::F32;
  RedOp redop = RedOp::Sum;
  int root = 0;
  int* agree = nullptr;           // consensus output
  int64_t timeout_ms = 0;         // 0: the peer's default
  std::string topology;           // empty: the peer's choice
  RequestState::Callback callback;
  std::shared_ptr<NormTap> norms;  // allreduce: sums of squares taken on the way
  // Internal: the automatic choice by size, whatever topology is in force. For an op whose
  // place in the op stream differs between ranks (posted from the loop when something
  // else happened), which a topology swap would otherwise catch on some ranks only.
  bool by_size = false;
};

class Peer final : private LoopBaton::Driver {
 public:
  // Joins the job (rendezvous, then a connection to every other peer). Blocks.
  static Result<std::unique_ptr<Peer>> create(const Config& config);
  ~Peer();

  int rank() const { return config_.rank; }
  int size() const { return config_.size; }
  const Config& config() const { return config_; }

  // Checks the arguments, reserves (name, version) and hands the op to the I/O thread,
  // or holds it in the calling thread's open group.
  Result<std::shared_ptr<RequestState>> post(PostArgs args);
  // post() for the runtime's own ops (statistics, monitoring): names under "taiji." allowed.
  // Holdable only where the caller's own thread posts it alongside the caller's op (a
  // companion that must keep its place in the group); ops posted from the loop never are.
  Result<std::shared_ptr<RequestState>> post_internal(PostArgs args, bool holdable);
  // A collective: every peer proposes a topology (an empty strategy: automatic choice by
  // size); if all agree, ops posted after this call use it; otherwise all get Mismatch and
  // keep the old one.
  Result<std::shared_ptr<RequestState>> set_topology(BoundStrategy proposed, int64_t timeout_ms,
                                                     RequestState::Callback callback);
  // Groups (runtime/post_groups.h): the calling thread's posts until the outermost
  // group_end are held, then handed to the I/O thread together. group_end fails with
  // InvalidArgument when no group is open on the calling thread.
  void group_start() { groups_.start(); }
  Status group_end();
  bool in_group() const { return groups_.open(); }
  // A built-in name or the explicit text form, for this cluster (its host map).
  Result<BoundStrategy> resolve_topology(const std::string& text) const;
  const std::vector<int>& host_of() const { return host_of_; }
  // Waits (bounded by the op timeout) for in-flight ops, says goodbye, stops the thread.
  Status finalize();
  // Fails every op with Aborted and closes all links at once; does not wait.
  void abort();
  Status async_error() const;
  // True on this peer's I/O thread (inside a completion callback), where blocking on an
  // op would stop the very loop that completes it. User callbacks run nowhere else, also
  // while a waiter runs the loop (runtime/loop_baton.h).
  bool on_io_thread() const;
  // Runs fn on the I/O thread, after the tasks handed over before it (posts included);
  // false (fn dropped) once the loop has closed.
  bool run_on_loop(std::function<void()> fn);
  std::thread::id io_thread_id() const { return io_thread_id_; }

  // Monitoring (peer_monitor.cpp). The registry lives as long as the peer.
  Metrics& metrics() { return *metrics_; }
  // The Prometheus endpoint's bound "host:port"; empty when it is not served.
  std::string metrics_address() const;
  // A collective: ends this rank's step (the time since its previous mark) and gathers
  // every rank's step time under "taiji.step", so that every peer can tell stragglers.
  Result<std::shared_ptr<RequestState>> step_mark(int64_t timeout_ms, RequestState::Callback callback);
  // Pings every other rank and waits for the replies (at most timeout_ms). Blocks.
  Status probe_rtt(int64_t timeout_ms);
  // The checks every post makes of its arguments (name, timeout, root, count, buffers),
  // for a caller that reads the buffers before posting.
  Status check_args(const PostArgs& args) const;

  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

 private:
  explicit Peer(const Config& config);
  Status bootstrap();
  Result<PostedOp> prepare(PostArgs& args);
  Result<std::shared_ptr<RequestState>> post_op(PostArgs args, bool holdable);
  // Hands a prepared op's start to the I/O thread, or (holdable) holds it in the calling
  // thread's open group. Fails (releasing the op's name) once the peer is closed.
  Status queue(const std::shared_ptr<PostedOp>& op, std::function<void()> task, bool holdable);
  // Held posts that will never start (the peer closed): their requests end with `why`,
  // on the loop while it runs (where user callbacks belong), else on the calling thread.
  void fail_held(std::vector<HeldPost> posts, const Status& why);
  // Every thread's held posts, as the peer closes; later posts in a group are refused.
  void fail_groups(const Status& why) { fail_held(groups_.close(), why); }
  // I/O thread: gives an op its graphs (the current topology, or the size rule).
  void bind(PostedOp& op) const;
  // The default table's built-in for an op of this size.
  BoundStrategy by_size(const CollectiveSpec& spec) const;
  // I/O thread: the graphs by size alone, ignoring the current topology (fusion's ops).
  void bind_by_size(PostedOp& op) const;
  // I/O thread: starts an op now, or later if a topology change is being agreed.
  void enter(std::function<void()> start);
  void open_gate();
  void drain_inbox();
  // After queueing work for the loop: wakes it unless it is polling its inbox anyway.
  void wake_loop();
  // I/O thread: runs the loop; in adaptive mode it polls for a while after traffic
  // before it sleeps in epoll again.
  void run_loop();
  // I/O thread: one polling window, ended early by bulk reads from other hosts; false
  // once the loop has nothing left to run. Lends the loop to a waiter that asks for it.
  bool poll(SpinWindow& window, uint64_t* seen, uint64_t* bytes);
  // A waiter, holding the baton: runs the loop on its own thread (LoopBaton::Driver).
  bool drive(const std::atomic<bool>& done, uint64_t window_ns, uint64_t hard_ns) override;
  // Callbacks deferred while a waiter drove: the I/O thread must run them.
  bool owes_io_thread() const override { return !deferred_.empty(); }
  // Loop owner: no op in flight, none held back by a topology change.
  bool ops_idle() const;
  // Loop owner: whether the loop has work the I/O thread should take up now.
  bool busy() const;
  // I/O thread: user callbacks that completed while a waiter ran the loop.
  void run_deferred_callbacks();
  // I/O thread: whether data now comes at a remote link's pace, so the loop should sleep
  // rather than poll: peers on other hosts and a large op in flight, or a bulk read since
  // *bytes (which it advances).
  bool paced_by_network(uint64_t* bytes);
  // I/O thread: changes whenever traffic arrives or work was posted.
  uint64_t activity() const {
    return transport_->read_events() + drained_ + shm_->mail_delivered();
  }
  void set_error(const Status& s);
  enum class CloseMode {
    Finalize,  // wait (up to the op timeout) for in-flight ops, then close with Bye
    Destroy,   // abort in-flight ops, then close with Bye
    Abort,     // abort in-flight ops, close at once
  };
  void begin_close(CloseMode mode);
  void on_tick();
  void close_links(bool graceful);
  void on_links_closed();
  void stop_thread();
  Status start_metrics_server();
  // I/O thread: writes the flight recorder to a file after ops timed out.
  void dump_flight_recorder(const Status& why);

  Config config_;
  const bool adaptive_;                  // TAIJI_PROGRESS=adaptive with a spin window
  NameTable names_;
  std::vector<int> host_of_;            // host index of every rank
  std::unique_ptr<StrategyCache> strategies_;

  // I/O thread only: the topology ops use when they name none (empty: by size), and ops
  // waiting for a topology change to settle.
  // Before the loop's members: the transport and engine write into it until they go.
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<MetricsServer> metrics_server_;
  uint64_t last_dump_ms_ = 0;            // I/O thread only
  uint64_t dumps_ = 0;                   // I/O thread only

  BoundStrategy current_;
  bool gate_ = false;
  std::deque<std::function<void()>> gated_;
  uv_loop_t loop_{};
  uv_async_t wake_{};
  uv_timer_t tick_{};
  std::unique_ptr<TcpTransport> transport_;
  std::unique_ptr<ShmTransport> shm_;    // over transport_: what the engine sends through
  std::unique_ptr<OpEngine> engine_;
  std::unique_ptr<Fusion> fusion_;       // null: fusion off
  std::unique_ptr<RendezvousServer> rendezvous_server_;
  // Adaptive mode: lends the loop to waiters. Requests share it; it outlives the loop.
  std::shared_ptr<LoopBaton> baton_;
  DeferredCallbacks deferred_;           // loop owner only
  std::thread thread_;
  std::atomic<std::thread::id> io_thread_id_{};

  // I/O thread only.
  bool finalizing_ = false;              // waiting for in-flight ops before closing
  bool closing_links_ = false;           // transport shutdown started
  uint64_t close_deadline_ = 0;

  PostGroups groups_;
  std::mutex inbox_mu_;
  std::vector<std::function<void()>> inbox_;
  bool loop_closed_ = false;             // under inbox_mu_
  // Written under inbox_mu_; read without it by the polling loop as a hint.
  std::atomic<bool> inbox_nonempty_{false};
  // True while the loop polls or is lent to a waiter: posters then skip the eventfd. The
  // I/O thread clears it, then drains the inbox once more (under inbox_mu_), so no post
  // goes unseen.
  std::atomic<bool> polling_{false};
  uint64_t drained_ = 0;                 // I/O thread only: inbox batches run
  // I/O thread only: ops above the eager size in flight, counted only with peers on other
  // hosts (the loop sleeps while one runs: their data comes at the link's pace).
  uint64_t large_ops_ = 0;
  bool one_host_ = false;                // every rank on this host: poll through bulk too

  mutable std::mutex state_mu_;
  Status sticky_;                        // under state_mu_
  bool closing_ = false;                 // under state_mu_: finalize/abort began
  std::mutex join_mu_;
  std::atomic<bool> joined_{false};
};

}  // namespace taiji
