// A peer: one process's (or one thread's) membership in a job. It wires together the
// parts that each have one job: the I/O loop (runtime/io_loop.h), the membership
// (runtime/membership.h), the transports (transport/transport_stack.h), the backends that
// execute ops (runtime/backend.h), op posting (runtime/op_poster.h) and monitoring; and it
// owns their lifecycle: bootstrap, finalize, abort. User callbacks run on the I/O thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/rendezvous.h"
#include "monitor/http_server.h"
#include "monitor/metrics.h"
#include "runtime/config.h"
#include "runtime/device_backend.h"
#include "runtime/host_backend.h"
#include "runtime/io_loop.h"
#include "runtime/link_prober.h"
#include "runtime/membership.h"
#include "runtime/model_service.h"
#include "runtime/name_table.h"
#include "runtime/op_poster.h"
#include "runtime/router.h"
#include "runtime/rtt_probes.h"
#include "topology/link_matrix.h"
#include "transport/transport_stack.h"

namespace taiji {

class DeviceHierarchy;

class Peer final : private ClusterListener {
 public:
  // Joins the job (rendezvous, then a connection to every other peer). Blocks. `served`:
  // a rendezvous server the peer keeps until it goes (a split child's rank 0 serves its
  // job's rendezvous this way).
  // When it fails, the server comes back through *served_back (if given), so that a
  // membership change that did not start keeps the job's store.
  static Result<std::unique_ptr<Peer>> create(const Config& config,
                                              std::unique_ptr<RendezvousServer> served = nullptr,
                                              std::unique_ptr<RendezvousServer>* served_back = nullptr);
  ~Peer();

  // Any thread: the current membership's.
  int rank() const { return membership_.rank(); }
  int size() const { return membership_.size(); }
  uint32_t cluster_version() const { return membership_.version(); }
  const Config& config() const { return config_; }

  // Checks the arguments, reserves (name, version) and hands the op to the I/O thread,
  // or holds it in the calling thread's open group. A device allreduce with topology
  // "hierarchical" runs as NCCL within each host and the host backend between hosts
  // (runtime/device_hierarchy.h; runtime/peer_hierarchy.cpp).
  Result<std::shared_ptr<RequestState>> post(PostArgs args) {
    if (args.kind == OpKind::Allreduce && args.topology == "hierarchical") return post_hierarchical(std::move(args));
    return poster_.post(std::move(args));
  }
  // post() for the runtime's own ops (statistics, monitoring): names under "taiji." allowed.
  // Holdable only where the caller's own thread posts it alongside the caller's op (a
  // companion that must keep its place in the group); ops posted from the loop never are.
  Result<std::shared_ptr<RequestState>> post_internal(PostArgs args, bool holdable) {
    return poster_.post_internal(std::move(args), holdable);
  }
  // A collective: every peer proposes a topology (an empty strategy: automatic choice by
  // size); if all agree, ops posted after this call use it; otherwise all get Mismatch and
  // keep the old one.
  Result<std::shared_ptr<RequestState>> set_topology(BoundStrategy proposed, int64_t timeout_ms,
                                                     RequestState::Callback callback) {
    return poster_.set_topology(std::move(proposed), timeout_ms, std::move(callback));
  }
  // Groups (runtime/post_groups.h): the calling thread's posts until the outermost
  // group_end are held, then handed to the I/O thread together. group_end fails with
  // InvalidArgument when no group is open on the calling thread.
  void group_start() { poster_.group_start(); }
  Status group_end() { return poster_.group_end(); }
  bool in_group() const { return poster_.in_group(); }
  // A built-in name or the explicit text form, for this cluster (its host map).
  Result<BoundStrategy> resolve_topology(const std::string& text) const {
    return poster_.resolve_topology(text);
  }
  // Any thread: the strategy an allreduce of `bytes` that names none would run on now.
  BoundStrategy topology_in_force(uint64_t bytes) const { return poster_.in_force(bytes); }
  // The checks every post makes of its arguments (name, timeout, root, count, buffers),
  // for a caller that reads the buffers before posting.
  Status check_args(const PostArgs& args) const { return poster_.check_args(args); }

  // Waits (bounded by the op timeout) for in-flight ops, says goodbye, stops the thread.
  Status finalize();
  // finalize() waiting at most wait_ms for in-flight ops (a resize's own deadline).
  Status finalize_within(int64_t wait_ms);
  // Any thread: the ranks that left this membership, lost without a Bye or finalized
  // (runtime/elastic.h).
  std::set<int> gone_ranks() const;
  // Forgets the ranks that finalized: a resize retires every member's peer, and their
  // goodbyes do not mean they left the job.
  void forget_departures();
  // Makes `why` the peer's sticky error (a resize that failed after the members agreed).
  void fail(const Status& why);
  // After finalize or abort: hands over the rendezvous server this peer serves (for the
  // next membership's peer) and stops its metrics endpoint, freeing the port.
  std::unique_ptr<RendezvousServer> release_services();
  // Keeps a server release_services handed out, when the next peer did not start.
  void keep_server(std::unique_ptr<RendezvousServer> server) { rendezvous_server_ = std::move(server); }
  // Fails every op with Aborted and closes all links at once; does not wait.
  void abort();
  Status async_error() const;
  // Neither closed (finalize, abort) nor failed: ops may be posted.
  bool usable() const { return !closed() && async_error().is_ok(); }
  // True on this peer's I/O thread (inside a completion callback), where blocking on an
  // op would stop the very loop that completes it. User callbacks run nowhere else, also
  // while a waiter runs the loop (runtime/loop_baton.h).
  bool on_io_thread() const { return io_.on_io_thread(); }
  // Runs fn on the I/O thread, after the tasks handed over before it (posts included);
  // false (fn dropped) once the loop has closed.
  bool run_on_loop(std::function<void()> fn) { return io_.run_on_loop(std::move(fn)); }
  std::thread::id io_thread_id() const { return io_.io_thread_id(); }

  // Fires the membership-change path with `next` on the I/O thread and waits for it
  // (bounded by the op timeout). Blocks; not from a completion callback.
  Status change_membership(Cluster next);

  // Monitoring (peer_monitor.cpp). The registry lives as long as the peer.
  Metrics& metrics() { return *metrics_; }
  // The Prometheus endpoint's bound "host:port"; empty when it is not served.
  std::string metrics_address() const;
  // A collective: ends this rank's step (the time since its previous mark) and gathers
  // every rank's step time under "taiji.step", so that every peer can tell stragglers.
  Result<std::shared_ptr<RequestState>> step_mark(int64_t timeout_ms, RequestState::Callback callback);
  // A collective over this job (runtime/peer_split.cpp): ranks with the same color >= 0
  // form a new job, ranked by (key, parent rank), each rank its own Peer with this one's
  // configuration; a negative color takes part and gets none (nullptr). Blocks, bounded
  // by timeout_ms (0: the op timeout); not from a completion callback.
  Result<std::unique_ptr<Peer>> split(int color, int key, int64_t timeout_ms);
  // Pings every other rank and waits for the replies (at most timeout_ms). Blocks.
  Status probe_rtt(int64_t timeout_ms);
  // The latest link matrix measured by every rank together (runtime/link_measure.h), the
  // same on every rank; null before the first. Any thread.
  // Background link probes (TAIJI_LINK_PROBE_RATE): this rank's row. Any thread.
  const LinkProber& link_prober() const { return *prober_; }
  std::shared_ptr<const LinkMatrix> links() const {
    std::lock_guard<std::mutex> lock(links_mu_);
    return links_;
  }
  void set_links(LinkMatrix m) {
    auto kept = std::make_shared<const LinkMatrix>(std::move(m));
    std::lock_guard<std::mutex> lock(links_mu_);
    links_ = std::move(kept);
  }

  // The model store (runtime/peer_models.cpp, runtime/model_service.h). Any thread; never
  // waits on the network. Returns the version saved.
  Result<uint64_t> model_save(const std::string& name, const void* data, uint64_t bytes, uint64_t version);
  // Fetches `name` at `version` (0: the latest) from `rank`'s store into buf, which must
  // stay valid until the request completes. timeout_ms 0: the op timeout. This rank's own
  // store is read on the calling thread; the callback runs on the I/O thread either way.
  Result<std::shared_ptr<RequestState>> model_request(int rank, const std::string& name, uint64_t version,
                                                      void* buf, uint64_t bytes, int64_t timeout_ms,
                                                      RequestState::Callback callback);

  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

 private:
  explicit Peer(const Config& config);
  Status bootstrap();
  // What the peer itself keeps of the membership: its gauge, whether all ranks share a host.
  void cluster_changed(const Cluster& before, const Cluster& now) override;
  void note_cluster(const Cluster& now);
  // Publishes this peer's address and learns every rank's: the cluster's first version.
  Status rendezvous(const std::string& self, std::chrono::steady_clock::time_point deadline);
  Status connect_links(std::chrono::steady_clock::time_point deadline);
  bool closed() const;
  void set_error(const Status& s);
  // Loop owner: no op in flight, none held back by a topology change.
  bool ops_idle() const { return host_->idle() && device_->idle() && poster_.gate_idle(); }
  // Loop owner: whether the loop has work the I/O thread should take up now.
  bool busy() const { return !ops_idle() || finalizing_ || closing_links_; }
  enum class CloseMode {
    Finalize,  // wait (up to the op timeout) for in-flight ops, then close with Bye
    Destroy,   // abort in-flight ops, then close with Bye
    Abort,     // abort in-flight ops, close at once
  };
  void begin_close(CloseMode mode, int64_t wait_ms = 0);
  void on_tick();
  void close_links(bool graceful);
  void on_links_closed();
  Status start_metrics_server();
  // I/O thread: writes the flight recorder to a file after ops timed out.
  void dump_flight_recorder(const Status& why);
  // post() of an allreduce with topology "hierarchical" (runtime/peer_hierarchy.cpp).
  Result<std::shared_ptr<RequestState>> post_hierarchical(PostArgs args);
  // The per-host and leader jobs of the hierarchical device allreduce, made by the first
  // one (two splits: a collective that blocks); the error of that split afterwards.
  Result<std::shared_ptr<DeviceHierarchy>> device_hierarchy();
  // Takes the hierarchy out (finalize, abort, destruction).
  std::shared_ptr<DeviceHierarchy> hierarchy_now() const;
  // The checks model_save and model_request make of a name.
  Status check_model_name(const std::string& name) const;

  Config config_;
  Membership membership_;
  NameTable names_;
  // Before the loop's members: the transports and the engine write into it until they go.
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<MetricsServer> metrics_server_;
  uint64_t last_dump_ms_ = 0;            // I/O thread only
  uint64_t dumps_ = 0;                   // I/O thread only

  IoLoop io_;
  Router router_;                        // what the transports deliver to: the services
  // Before the transports: a reply's chunks borrow the store's bytes until they are sent.
  std::unique_ptr<ModelStore> models_;
  std::unique_ptr<ModelService> model_service_;
  std::unique_ptr<TransportStack> transports_;
  std::unique_ptr<HostBackend> host_;
  std::unique_ptr<DeviceBackend> device_;
  std::unique_ptr<RttProbes> probes_;
  std::unique_ptr<LinkProber> prober_;
  OpPoster poster_;
  std::unique_ptr<RendezvousServer> rendezvous_server_;

  std::mutex hierarchy_make_mu_;          // held while the hierarchy's splits run
  mutable std::mutex hierarchy_mu_;
  std::shared_ptr<DeviceHierarchy> hierarchy_;  // under hierarchy_mu_
  Status hierarchy_error_;                      // under hierarchy_mu_: the failed split's

  mutable std::mutex links_mu_;
  std::shared_ptr<const LinkMatrix> links_;     // under links_mu_

  // I/O thread only.
  bool finalizing_ = false;              // waiting for in-flight ops before closing
  bool closing_links_ = false;           // transport shutdown started
  uint64_t close_deadline_ = 0;

  mutable std::mutex state_mu_;
  Status sticky_;                        // under state_mu_
  std::set<int> lost_;                   // under state_mu_: ranks lost without a Bye
  std::set<int> departed_;               // under state_mu_: ranks that finalized
  bool closing_ = false;                 // under state_mu_: finalize/abort began
};

}  // namespace taiji
