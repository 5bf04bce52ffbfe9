#include "runtime/grad_stats_op.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "monitor/metrics.h"

namespace taiji {

namespace {

constexpr const char* kNormPrefix = "taiji.gn/";
constexpr const char* kSquaresPrefix = "taiji.gv/";

Status invalid(const std::string& m) { return {Code::InvalidArgument, m}; }

// The reductions of one tensor in flight; the last to finish computes the statistics and
// completes the caller's request.
struct Join : std::enable_shared_from_this<Join> {
  std::mutex mu;
  int pending = 0;
  Status status;
  std::shared_ptr<RequestState> user;  // set once the caller's post returned
  bool posted = false;
  // The norm companion goes out once both this peer's norms are counted (by the
  // gradient's own reduction, on the I/O thread) and the gradient's version is known (when
  // the caller's post returns), whichever is later. A gradient that fails before its norm
  // is counted still sends one (NaN), so that every peer's companion completes at once.
  Peer* peer = nullptr;
  // The caller's deadline (monotonic ns) bounds the companions too: they end with it.
  uint64_t deadline_ns = 0;
  std::weak_ptr<RequestState> gradient;
  uint64_t topology_digest = 0;        // the gradient's, once it ran
  uint64_t version = 0;
  bool version_known = false;
  bool norms_ready = false;
  bool norm_handled = false;           // posted

  std::shared_ptr<GradStats> stats;
  Metrics* metrics = nullptr;          // the peer's: the estimates are published there
  std::string name;
  DType dtype = DType::F32;
  RedOp redop = RedOp::Sum;
  const void* recv = nullptr;
  size_t count = 0;
  int n = 1;
  double scale2 = 1;
  // Sent: this peer's ||g_i||^2 (loss scale out), and its share of ||sum g_i||^2 (the
  // chunks whose reduction ended here); received: their sums over the peers.
  double norms[2] = {0, 0};
  double norm_sums[2] = {0, 0};
  std::vector<double> squares;         // g_i^2 per element, summed in place

  void done(const Status& s) {
    std::shared_ptr<RequestState> finish;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!s.is_ok() && status.is_ok()) status = s;
      if (--pending > 0 || !posted) return;
      finish = user;
    }
    complete(finish);
  }

  void gradient_done(const Status& s) {
    bool go = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      // Bound on the loop as it started: known now, and the caller's request reports it.
      // (Not yet known to the join when the gradient ends before its post returns; the
      // post reads it then.)
      if (auto g = gradient.lock()) topology_digest = g->topology_digest();
      if (!s.is_ok()) {
        if (!norms_ready) {
          norms[0] = norms[1] = std::nan("");
          norms_ready = true;
        }
        go = take_norm_turn();
      }
    }
    // The gradient's own error first: a companion that cannot even be posted (the peer
    // was aborted meanwhile) must not replace it.
    done(s);
    if (go) post_norm();
  }

  // What is left of the caller's deadline, for a companion posted now (at least 1 ms).
  int64_t remaining_ms() const {
    const uint64_t now = monotonic_ns();
    return now >= deadline_ns ? 1 : std::max<int64_t>(1, static_cast<int64_t>((deadline_ns - now) / 1000000));
  }

  // One of the two conditions for sending the norm companion became true (under mu).
  bool take_norm_turn() {
    if (!norms_ready || !version_known || norm_handled) return false;
    norm_handled = true;
    return true;
  }

  void post_norm() {
    PostArgs c;
    c.kind = OpKind::Allreduce;
    c.name = std::string(kNormPrefix) + name;
    c.version = version;
    c.send = norms;
    c.recv = norm_sums;
    c.count = 2;
    c.dtype = DType::F64;
    c.redop = RedOp::Sum;
    c.timeout_ms = remaining_ms();
    // Posted when this rank's norms are counted, which is earlier on a leaf than on the
    // root: a topology swap posted after the gradient may be in force on some ranks only.
    c.by_size = true;
    c.callback = [self = shared_from_this()](const Status& st) { self->done(st); };
    // Never held: it may go out from the loop, as the gradient's norms are counted.
    auto r = peer->post_internal(std::move(c), false);
    // Posting failed (the peer closed meanwhile): nothing will report for it.
    if (!r.is_ok()) done(r.status());
  }

  // Every reduction ended: runs once, on whichever thread saw the last one end.
  void complete(const std::shared_ptr<RequestState>& request) {
    if (status.is_ok()) {
      const double mean_factor = redop == RedOp::Sum ? 1.0 / n : 1.0;
      // One division by n^2 (exact when the sum is), not two multiplications by 1/n.
      const double global_sq =
          (redop == RedOp::Sum ? norm_sums[1] / (static_cast<double>(n) * n) : norm_sums[1]) / scale2;
      const double local_mean = norm_sums[0] / n;
      if (squares.empty()) {
        stats->add_tensor(name, local_mean, global_sq, nullptr);
      } else {
        TensorVariance v;
        double l2 = 0;
        for (size_t i = 0; i < count; ++i) {
          const double mean = element_as_f64(dtype, recv, i) * mean_factor;
          const double var = (squares[i] / n - mean * mean) / scale2;
          l2 += var * var;
          v.sum += var;
        }
        v.l2 = std::sqrt(l2);
        stats->add_tensor(name, local_mean, global_sq, &v);
        metrics->set_gauge("taiji_grad_variance_l2", {{"name", name}}, v.l2,
                           "L2 norm of the element-wise gradient variance across peers, last step.");
      }
      publish_grad_stats(*metrics, *stats);
    }
    request->set_topology_digest(topology_digest);
    request->complete(status);
  }
};

}  // namespace

void publish_grad_stats(Metrics& metrics, const GradStats& stats) {
  const NoiseScaleEstimate e = stats.estimate();
  metrics.set_gauge("taiji_grad_noise_scale", {}, e.noise_scale,
                    "Gradient noise scale B_simple = tr(Sigma)/|G|^2 (McCandlish et al.).");
  metrics.set_gauge("taiji_grad_snr", {}, e.snr,
                    "Gradient signal-to-noise ratio at the current global batch.");
  metrics.set_gauge("taiji_grad_signal_sq_norm", {}, e.g2, "Smoothed estimate of |G|^2.");
  metrics.set_gauge("taiji_grad_noise_trace", {}, e.trace_sigma, "Smoothed estimate of tr(Sigma).");
  metrics.set_gauge("taiji_grad_stats_steps", {}, static_cast<double>(e.steps),
                    "Steps folded into the gradient statistics.");
}

GradStats::GradStats(GradStatsConfig config, int world_size)
    : config_(config), world_size_(world_size), estimator_(config.beta) {}

Status GradStats::set_loss_scale(double scale) {
  if (!(scale > 0) || !std::isfinite(scale)) return invalid("loss scale must be finite and > 0");
  std::lock_guard<std::mutex> lock(mu_);
  loss_scale_ = scale;
  return {};
}

double GradStats::loss_scale() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loss_scale_;
}

void GradStats::add_tensor(const std::string& name, double local_sq, double global_sq,
                           const TensorVariance* variance) {
  std::lock_guard<std::mutex> lock(mu_);
  step_local_ += local_sq;
  step_global_ += global_sq;
  step_tensors_++;
  if (variance != nullptr) {
    TensorVariance& v = variance_[name];
    v.l2 = variance->l2;
    v.sum = variance->sum;
    v.updates++;
  }
  if (config_.tensors_per_step > 0 && step_tensors_ >= config_.tensors_per_step) commit_locked();
}

void GradStats::commit() {
  std::lock_guard<std::mutex> lock(mu_);
  commit_locked();
}

void GradStats::commit_locked() {
  if (step_tensors_ > 0 || world_size_ < 2) {
    estimator_.add(step_local_, step_global_, world_size_, config_.batch_size);
  }
  step_local_ = 0;
  step_global_ = 0;
  step_tensors_ = 0;
}

void GradStats::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  estimator_.reset();
  variance_.clear();
  step_local_ = 0;
  step_global_ = 0;
  step_tensors_ = 0;
}

NoiseScaleEstimate GradStats::estimate() const {
  std::lock_guard<std::mutex> lock(mu_);
  NoiseScaleEstimate e = estimator_.estimate();
  if (world_size_ < 2) e.state = EstimateState::SinglePeer;
  return e;
}

bool GradStats::tensor_variance(const std::string& name, TensorVariance* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = variance_.find(name);
  if (it == variance_.end()) return false;
  *out = it->second;
  return true;
}

Result<std::shared_ptr<RequestState>> post_allreduce_with_stats(Peer& peer, PostArgs args,
                                                                std::shared_ptr<GradStats> stats) {
  if (args.kind != OpKind::Allreduce) return invalid("gradient statistics attach to allreduce only");
  // The element variance reads the input below, before the post would check it.
  if (Status s = peer.check_args(args); !s.is_ok()) return s;
  if (!dtype_is_float(args.dtype)) return invalid("gradient statistics need a float dtype");
  if (args.redop != RedOp::Sum && args.redop != RedOp::Avg) {
    return invalid("gradient statistics need a SUM or AVG allreduce");
  }
  if (stats->world_size() != peer.size()) return invalid("the statistics object belongs to another peer");
  const size_t cap = peer.config().max_name_len;
  if (args.name.size() + std::string(kNormPrefix).size() > cap) {
    return invalid("op name too long to carry statistics (at most " +
                   std::to_string(cap - std::string(kNormPrefix).size()) + " bytes)");
  }
  auto join = std::make_shared<Join>();
  join->stats = stats;
  join->metrics = &peer.metrics();
  join->peer = &peer;
  join->name = args.name;
  join->dtype = args.dtype;
  join->redop = args.redop;
  join->recv = args.recv;
  join->count = args.count;
  join->n = peer.size();
  const int64_t timeout_ms = args.timeout_ms > 0 ? args.timeout_ms : peer.config().timeout_ms;
  join->deadline_ns = monotonic_ns() + static_cast<uint64_t>(timeout_ms) * 1000000;
  const double scale = stats->loss_scale();
  join->scale2 = scale * scale;
  // The gradient's reduction counts ||g_i||^2 as it first reads each chunk of the input,
  // and ||g||^2 where each chunk's reduction ends: no pass of its own over the buffer.
  auto tap = std::make_shared<NormTap>();
  // Weak: the op holds the tap, so a strong capture would keep the join alive after a post
  // that failed; the gradient's callback keeps it alive while the op runs.
  tap->on_counted = [weak = std::weak_ptr<Join>(join)](double local, double rooted) {
    auto join = weak.lock();
    if (!join) return;
    bool go;
    {
      std::lock_guard<std::mutex> lock(join->mu);
      join->norms[0] = local / join->scale2;
      join->norms[1] = rooted;
      join->norms_ready = true;
      go = join->take_norm_turn();
    }
    if (go) join->post_norm();
  };
  const bool variance = stats->config().element_variance;
  if (variance) {
    // Before posting: with sendbuf == recvbuf the reduction overwrites the input.
    join->squares.resize(args.count);
    for (size_t i = 0; i < args.count; ++i) {
      const double v = element_as_f64(args.dtype, args.send, i);
      join->squares[i] = v * v;
    }
  }
  join->pending = variance ? 3 : 2;

  RequestState::Callback user_callback = std::move(args.callback);
  const std::string name = args.name;
  args.callback = [join](const Status& s) { join->gradient_done(s); };
  args.norms = tap;
  auto grad = peer.post(std::move(args));
  if (!grad.is_ok()) return grad.status();
  const uint64_t version = grad.value()->version();
  auto user = std::make_shared<RequestState>(version, std::move(user_callback));
  {
    // The gradient may have ended already (then its digest is set), or not yet started.
    std::lock_guard<std::mutex> lock(join->mu);
    join->gradient = grad.value();
    join->topology_digest = grad.value()->topology_digest();
  }
  // Held in the caller's group exactly as long as the gradient's own op is.
  user->hold_with(grad.value());

  if (variance) {
    PostArgs c;
    c.kind = OpKind::Allreduce;
    c.name = kSquaresPrefix + name;
    c.version = version;
    c.send = join->squares.data();
    c.recv = join->squares.data();
    c.count = join->squares.size();
    c.dtype = DType::F64;
    c.redop = RedOp::Sum;
    c.timeout_ms = join->remaining_ms();
    c.callback = [join](const Status& s) { join->done(s); };
    // Held with the gradient when the caller is in a group: every peer must see it in the
    // same place among the caller's ops (a topology swap held before it, say).
    auto r = peer.post_internal(std::move(c), true);
    if (!r.is_ok()) join->done(r.status());
  }
  bool go;
  bool finished;
  {
    std::lock_guard<std::mutex> lock(join->mu);
    join->version = version;
    join->version_known = true;
    go = join->take_norm_turn();
  }
  if (go) join->post_norm();
  {
    std::lock_guard<std::mutex> lock(join->mu);
    join->user = user;
    join->posted = true;
    finished = join->pending == 0;
  }
  // Every reduction already ended: the caller's callback still runs on the I/O thread.
  if (finished && !peer.run_on_loop([join, user] { join->complete(user); })) join->complete(user);
  return user;
}

}  // namespace taiji
