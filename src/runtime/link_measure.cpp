#include "runtime/link_measure.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <string>

#include "runtime/internal_gather.h"
#include "runtime/peer.h"

namespace taiji {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kProbeName = "taiji.links";
constexpr const char* kMatrixName = "taiji.links.matrix";
constexpr uint64_t kSmallBytes = 8;
// The op deadline ends every probe; this only guards against a loop that stopped.
constexpr int64_t kWaitGraceMs = 1000;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One point-to-point op of the measurement, waited for.
Status p2p(Peer& peer, OpKind kind, int other, std::shared_ptr<std::vector<uint8_t>> buf, uint64_t bytes,
           Clock::time_point deadline) {
  const int64_t timeout_ms = left_ms(deadline);
  const char* verb = kind == OpKind::Send ? "to" : "from";
  if (timeout_ms == 0) {
    return {Code::Timeout, std::string("measure links: no time left for a probe ") + verb + " rank " +
                               std::to_string(other)};
  }
  PostArgs args;
  args.kind = kind;
  args.name = kProbeName;
  args.send = buf->data();
  args.recv = buf->data();
  args.count = bytes;
  args.dtype = DType::U8;
  args.peer = other;
  args.timeout_ms = timeout_ms;
  args.callback = [buf](const Status&) {};
  auto posted = peer.post_internal(std::move(args), false);
  Status result = posted.status();
  if (posted.is_ok() && !posted.value()->wait_for(timeout_ms + kWaitGraceMs, &result)) {
    result = {Code::Timeout, "did not complete on the I/O thread"};
  }
  if (result.is_ok()) return result;
  return {result.code(), std::string("measure links: probe ") + verb + " rank " + std::to_string(other) + ": " +
                             result.message()};
}

struct Direction {
  double latency = 0;    // seconds, one way
  double bandwidth = 0;  // bytes per second
};

// The sender's side of one direction: times small and large messages and their answers.
Result<Direction> probe_to(Peer& peer, int dst, const LinkMeasureOptions& o,
                           const std::shared_ptr<std::vector<uint8_t>>& big,
                           const std::shared_ptr<std::vector<uint8_t>>& small, Clock::time_point deadline) {
  double rtt = std::numeric_limits<double>::infinity();
  for (int i = 0; i < o.latency_rounds; ++i) {
    const auto t0 = Clock::now();
    if (Status s = p2p(peer, OpKind::Send, dst, small, kSmallBytes, deadline); !s.is_ok()) return s;
    if (Status s = p2p(peer, OpKind::Recv, dst, small, kSmallBytes, deadline); !s.is_ok()) return s;
    rtt = std::min(rtt, seconds_since(t0));
  }
  double best = 0;
  for (int i = 0; i < o.bandwidth_rounds; ++i) {
    const auto t0 = Clock::now();
    if (Status s = p2p(peer, OpKind::Send, dst, big, o.probe_bytes, deadline); !s.is_ok()) return s;
    if (Status s = p2p(peer, OpKind::Recv, dst, small, kSmallBytes, deadline); !s.is_ok()) return s;
    // The answer's round trip is not transfer time; a probe too small to show past it
    // (or a clock step) still gives a finite figure.
    const double t = seconds_since(t0);
    best = std::max(best, static_cast<double>(o.probe_bytes) / std::max(t - rtt, t / 10));
  }
  return Direction{rtt / 2, best};
}

// The receiver's side: answers each message as it arrives, in the sender's order.
Status answer_from(Peer& peer, int src, const LinkMeasureOptions& o, const std::shared_ptr<std::vector<uint8_t>>& big,
                   const std::shared_ptr<std::vector<uint8_t>>& small, Clock::time_point deadline) {
  for (int i = 0; i < o.latency_rounds + o.bandwidth_rounds; ++i) {
    const bool large = i >= o.latency_rounds;
    const auto& in = large ? big : small;
    if (Status s = p2p(peer, OpKind::Recv, src, in, large ? o.probe_bytes : kSmallBytes, deadline); !s.is_ok()) {
      return s;
    }
    if (Status s = p2p(peer, OpKind::Send, src, small, kSmallBytes, deadline); !s.is_ok()) return s;
  }
  return {};
}

Status check_options(const LinkMeasureOptions& o) {
  if (o.probe_bytes < 1 || o.probe_bytes > kMaxProbeBytes) {
    return {Code::InvalidArgument, "measure links: probe_bytes must be 1 to " + std::to_string(kMaxProbeBytes) +
                                       ", got " + std::to_string(o.probe_bytes)};
  }
  if (o.latency_rounds < 1 || o.latency_rounds > kMaxProbeRounds || o.bandwidth_rounds < 1 ||
      o.bandwidth_rounds > kMaxProbeRounds) {
    return {Code::InvalidArgument, "measure links: latency_rounds and bandwidth_rounds must be 1 to " +
                                       std::to_string(kMaxProbeRounds)};
  }
  if (o.timeout_ms < 0) return {Code::InvalidArgument, "measure links: negative timeout"};
  return {};
}

void publish_row(Metrics& metrics, const LinkMatrix& m, int rank) {
  for (int dst = 0; dst < m.n; ++dst) {
    if (dst == rank) continue;
    const Labels peer{{"peer", std::to_string(dst)}};
    metrics.set_gauge("taiji_link_bandwidth_bytes_per_second", peer, m.bw(rank, dst),
                      "Bandwidth to a peer, from the latest link measurement.");
    metrics.set_gauge("taiji_link_latency_seconds", peer, m.lat(rank, dst),
                      "One-way latency to a peer, from the latest link measurement.");
  }
}

}  // namespace

std::vector<std::vector<std::pair<int, int>>> probe_schedule(int n) {
  std::vector<std::vector<std::pair<int, int>>> rounds;
  if (n < 2) return rounds;
  const int m = n % 2 == 0 ? n : n + 1;  // rank n, when present, is nobody: its partner sits out
  for (int r = 0; r < m - 1; ++r) {
    // Rank 0 stays; the others turn one place a round. Position i meets position m-1-i.
    auto at = [&](int i) { return i == 0 ? 0 : 1 + (r + i - 1) % (m - 1); };
    std::vector<std::pair<int, int>> round;
    for (int i = 0; i < m / 2; ++i) {
      const int a = at(i), b = at(m - 1 - i);
      if (a >= n || b >= n) continue;
      round.emplace_back(std::min(a, b), std::max(a, b));
    }
    std::sort(round.begin(), round.end());
    rounds.push_back(std::move(round));
  }
  return rounds;
}

Result<LinkMatrix> measure_links(Peer& peer, const LinkMeasureOptions& options) {
  if (Status s = check_options(options); !s.is_ok()) return s;
  if (peer.on_io_thread()) {
    return Status{Code::InvalidArgument, "measure links waits; it cannot run from a completion callback"};
  }
  const int n = peer.size(), me = peer.rank();
  const int64_t timeout_ms = options.timeout_ms > 0 ? options.timeout_ms : peer.config().timeout_ms;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto big = std::make_shared<std::vector<uint8_t>>(options.background ? 0 : options.probe_bytes);
  auto small = std::make_shared<std::vector<uint8_t>>(kSmallBytes);
  std::vector<double> row(2 * static_cast<size_t>(n), 0.0);  // bandwidth to each rank, then latency
  if (options.background) {
    const std::vector<double> bw = peer.link_prober().bandwidth_row(), lat = peer.link_prober().latency_row();
    std::copy(bw.begin(), bw.end(), row.begin());
    std::copy(lat.begin(), lat.end(), row.begin() + n);
  }
  const auto schedule = options.background ? std::vector<std::vector<std::pair<int, int>>>{} : probe_schedule(n);
  for (const auto& round : schedule) {
    for (const auto& [a, b] : round) {
      if (me != a && me != b) continue;
      const int other = me == a ? b : a;
      // a's direction first, then b's: both sides run the same sequence of ops.
      for (int sender : {a, b}) {
        if (sender == me) {
          auto d = probe_to(peer, other, options, big, small, deadline);
          if (!d.is_ok()) return d.status();
          row[static_cast<size_t>(other)] = d.value().bandwidth;
          row[static_cast<size_t>(n + other)] = d.value().latency;
        } else if (Status s = answer_from(peer, other, options, big, small, deadline); !s.is_ok()) {
          return s;
        }
      }
    }
  }
  auto send = std::make_shared<std::vector<uint8_t>>(row.size() * sizeof(double));
  auto recv = std::make_shared<std::vector<uint8_t>>(send->size() * static_cast<size_t>(n));
  std::copy_n(reinterpret_cast<const uint8_t*>(row.data()), send->size(), send->data());
  if (Status s = internal_gather(peer, "measure links", kMatrixName, 0, send, recv, DType::F64, row.size(), deadline,
                                 nullptr);
      !s.is_ok()) {
    return s;
  }
  std::vector<double> all(row.size() * static_cast<size_t>(n));
  std::copy_n(recv->data(), recv->size(), reinterpret_cast<uint8_t*>(all.data()));
  LinkMatrix m = LinkMatrix::sized(n);
  for (int src = 0; src < n; ++src) {
    for (int dst = 0; dst < n; ++dst) {
      const size_t base = static_cast<size_t>(src) * row.size();
      m.bandwidth[m.index(src, dst)] = all[base + static_cast<size_t>(dst)];
      m.latency[m.index(src, dst)] = all[base + static_cast<size_t>(n + dst)];
    }
  }
  publish_row(peer.metrics(), m, me);
  peer.set_links(m);
  return m;
}

}  // namespace taiji
