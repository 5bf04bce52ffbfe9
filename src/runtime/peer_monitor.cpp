// The peer's monitoring: step marks with straggler detection, round-trip probes, the
// Prometheus endpoint, and flight recorder dumps after timeouts.
//
// A step mark is an allgather of one f64 per rank (this rank's step time) under the
// reserved name "taiji.step": every peer learns every rank's step time in one small
// collective and judges each against the median.
#include <unistd.h>

#include <cstdio>

#include "monitor/log.h"
#include "runtime/peer.h"

namespace taiji {

namespace {

constexpr const char* kStepOpName = "taiji.step";
// Timeouts in one burst (a hung peer fails many ops) share one dump.
constexpr uint64_t kMinDumpIntervalMs = 1000;

// Keeps a file name to [A-Za-z0-9._-].
std::string file_safe(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  return out;
}

}  // namespace

std::string Peer::metrics_address() const {
  return metrics_server_ ? metrics_server_->address() : std::string();
}

Status Peer::start_metrics_server() {
  std::string host;
  uint16_t port = 0;
  if (std::string why = parse_metrics_address(config_.metrics_addr, &host, &port); !why.empty()) {
    return {Code::Config, "TAIJI_METRICS_ADDR='" + config_.metrics_addr + "': " + why};
  }
  // Peers sharing a host (and a configuration) take consecutive ports from the one given.
  if (port != 0) {
    int local = 0;
    const std::vector<int>& host_of = membership_.current().host_of;
    for (int r = 0; r < rank(); ++r) local += host_of[r] == host_of[rank()] ? 1 : 0;
    if (port + local > 65535) {
      return {Code::Config, "TAIJI_METRICS_ADDR='" + config_.metrics_addr + "': port " +
                                std::to_string(port) + " + local index " + std::to_string(local) +
                                " is beyond 65535"};
    }
    port = static_cast<uint16_t>(port + local);
  }
  Metrics* m = metrics_.get();
  auto server = MetricsServer::start(host, port, [m] { return m->prometheus(); });
  if (!server.is_ok()) return server.status();
  metrics_server_ = std::move(server.value());
  log().info("rank {}: Prometheus metrics at http://{}/metrics", rank(), metrics_server_->address());
  return {};
}

Result<std::shared_ptr<RequestState>> Peer::step_mark(int64_t timeout_ms,
                                                     RequestState::Callback callback) {
  struct Gathered {
    double mine = -1;
    std::vector<double> all;
  };
  auto gathered = std::make_shared<Gathered>();
  gathered->all.assign(static_cast<size_t>(size()), -1.0);
  PostArgs args;
  args.kind = OpKind::Allgather;
  args.name = kStepOpName;
  args.send = &gathered->mine;
  args.recv = gathered->all.data();
  args.count = 1;
  args.dtype = DType::F64;
  args.timeout_ms = timeout_ms;
  args.callback = std::move(callback);
  auto prepared = poster_.prepare(args);
  if (!prepared.is_ok()) return prepared.status();
  gathered->mine = metrics_->step_end(monotonic_ns());
  auto op = std::make_shared<PostedOp>(std::move(prepared.value()));
  // Before the request completes, so a caller that waited on it reads this step.
  op->finish_hook = [this, gathered](const Status& s) {
    if (s.is_ok()) metrics_->record_step(gathered->all);
    return s;
  };
  return poster_.submit(op, true);
}

Status Peer::probe_rtt(int64_t timeout_ms) {
  if (on_io_thread()) {
    return {Code::InvalidArgument, "a round-trip probe waits; it cannot run from a completion callback"};
  }
  if (closed()) return {Code::Finalized, "peer is finalized or aborted"};
  std::vector<int> others;
  for (int r = 0; r < size(); ++r) {
    if (r != rank()) others.push_back(r);
  }
  if (others.empty()) return {};
  const uint32_t round = metrics_->rtt_begin();
  run_on_loop([this, round] {
    metrics_->rtt_sending(round, monotonic_ns());
    probes_->send(round);
  });
  return metrics_->rtt_wait(round, others, timeout_ms);
}

void Peer::dump_flight_recorder(const Status& why) {
  const uint64_t now = uv_now(io_.uv());
  if (dumps_ > 0 && now < last_dump_ms_ + kMinDumpIntervalMs) return;
  last_dump_ms_ = now;
  const std::string json = metrics_->flight_json(why.message());
  const std::string path = config_.flight_recorder_dir + "/taiji-flight-" + file_safe(config_.job_id) +
                           "-rank" + std::to_string(rank()) + "-pid" + std::to_string(getpid()) +
                           "-" + std::to_string(++dumps_) + ".json";
  metrics_->count_dump();
  FILE* f = std::fopen(path.c_str(), "w");
  bool written = f != nullptr && std::fwrite(json.data(), 1, json.size(), f) == json.size();
  if (f != nullptr) written = std::fclose(f) == 0 && written;
  if (written) {
    log().warn("flight recorder: the last ops of rank {} are in {}", rank(), path);
  } else {
    log().warn("flight recorder: cannot write {}; the last ops of rank {}: {}", path, rank(), json);
  }
}

}  // namespace taiji
