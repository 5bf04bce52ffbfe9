#include "runtime/adapt_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <sstream>

#include "monitor/log.h"
#include "monitor/metrics.h"
#include "runtime/internal_gather.h"
#include "runtime/link_measure.h"
#include "runtime/peer.h"
#include "topology/link_optimizer.h"
#include "topology/text.h"

namespace taiji {

namespace {

constexpr const char* kAdaptOpName = "taiji.adapt";
// The set_topology consensus ends on its own deadline; this only guards a stopped loop.
constexpr int64_t kWaitGraceMs = 1000;

// The record's columns; the custom inputs follow, in key order, padded to the maximum.
enum Column : size_t {
  kStepSeconds,
  kSamples,
  kLinkRate,
  kRequestedSize,
  kNoiseScale,
  kSnr,
  kSyncMode,
  kStepIndex,
  kInputCount,
  kInputKeysHash,
  kInputsStart,
};
constexpr size_t kWidth = kInputsStart + kMaxAdaptInputs;

// FNV-1a over the keys (each followed by a zero byte), cut to 52 bits so that a double
// carries it exactly: equal on two ranks when they set the same keys.
double keys_hash(const std::map<std::string, double>& inputs) {
  uint64_t h = UINT64_C(14695981039346656037);
  for (const auto& [key, value] : inputs) {
    for (char c : key) h = (h ^ static_cast<uint8_t>(c)) * UINT64_C(1099511628211);
    h = (h ^ 0) * UINT64_C(1099511628211);
  }
  return static_cast<double>(h & ((UINT64_C(1) << 52) - 1));
}

double column(const std::vector<double>& all, int rank, size_t c) {
  return all[static_cast<size_t>(rank) * kWidth + c];
}

// Names what differs between rank r and rank 0, or "" when nothing does.
std::string disagreement(const std::vector<double>& all, int r) {
  if (column(all, r, kStepIndex) != column(all, 0, kStepIndex)) {
    return "rank " + std::to_string(r) + " is at adaptation step " +
           std::to_string(static_cast<uint64_t>(column(all, r, kStepIndex))) + ", rank 0 at " +
           std::to_string(static_cast<uint64_t>(column(all, 0, kStepIndex)));
  }
  if (column(all, r, kSyncMode) != column(all, 0, kSyncMode)) {
    return "rank " + std::to_string(r) + " is in sync mode " +
           sync_mode_name(static_cast<SyncMode>(column(all, r, kSyncMode))) + ", rank 0 in " +
           sync_mode_name(static_cast<SyncMode>(column(all, 0, kSyncMode)));
  }
  if (column(all, r, kInputCount) != column(all, 0, kInputCount) ||
      column(all, r, kInputKeysHash) != column(all, 0, kInputKeysHash)) {
    return "rank " + std::to_string(r) + " set other custom input keys than rank 0 (" +
           std::to_string(static_cast<int>(column(all, r, kInputCount))) + " vs " +
           std::to_string(static_cast<int>(column(all, 0, kInputCount))) +
           " keys); every rank must set the same keys";
  }
  return {};
}

Status apply_topology(Peer& peer, Action& action, int64_t timeout_ms) {
  auto bound = peer.resolve_topology(action.topology);
  if (!bound.is_ok()) {
    return {bound.status().code(), "adapt step: topology from " + action.policy + ": " + bound.status().message()};
  }
  auto posted = peer.set_topology(std::move(bound.value()), timeout_ms, [](const Status&) {});
  if (!posted.is_ok()) return {posted.status().code(), "adapt step: set topology: " + posted.status().message()};
  Status result;
  if (!posted.value()->wait_for(timeout_ms + kWaitGraceMs, &result)) {
    return {Code::Timeout, "adapt step: set topology did not complete on the I/O thread"};
  }
  if (!result.is_ok()) return {result.code(), "adapt step: set topology: " + result.message()};
  action.applied = true;
  return {};
}

// Measures every link, computes the best strategy for the action's size, and swaps to it
// when the topology in force is predicted at least min_gain x slower. Every rank holds the
// same matrix and the same topology, so every rank decides the same.
Status apply_measure_links(Peer& peer, Action& action, int64_t timeout_ms) {
  LinkMeasureOptions measure;
  measure.timeout_ms = timeout_ms;
  auto matrix = measure_links(peer, measure);
  if (!matrix.is_ok()) return {matrix.status().code(), "adapt step: " + matrix.status().message()};
  OptimizeOptions o;
  o.bytes = action.bytes;
  if (peer.config().chunk_bytes != 0) o.chunk_bytes = peer.config().chunk_bytes;
  auto best = optimize_topology(matrix.value(), o);
  if (!best.is_ok()) return {best.status().code(), "adapt step: optimise topology: " + best.status().message()};
  const BoundStrategy now = peer.topology_in_force(o.bytes);
  const double predicted_now =
      now.strategy ? predict_allreduce(*now.strategy, matrix.value(), o.bytes, o.chunk_bytes).seconds : 0;
  const double predicted_best = best.value().cost.seconds;
  std::ostringstream why;
  why << action.reason << "; " << best.value().explanation << "; in force: "
      << (now.strategy ? now.strategy->name : std::string("automatic")) << " " << predicted_now << " s";
  const bool same = now.strategy && now.digest == topology_digest(best.value().strategy);
  if (same || predicted_now < action.min_gain * predicted_best) {
    why << ", kept (gain " << (predicted_best > 0 ? predicted_now / predicted_best : 0) << " < " << action.min_gain
        << ")";
    action.reason = why.str();
    action.topology.clear();
    action.applied = true;
    log().info("adapt step: links measured, topology kept: {}", action.reason);
    return {};
  }
  why << ", swapped";
  action.reason = why.str();
  action.topology = to_text(best.value().strategy);
  log().info("adapt step: links measured, topology swapped: {}", action.reason);
  return apply_topology(peer, action, timeout_ms);
}

}  // namespace

Status adapt_step(Peer& peer, Engine& engine, const AdaptRecordInputs& in, int64_t timeout_ms,
                  StepTable* table_out, std::vector<Action>* actions) {
  actions->clear();
  if (in.inputs.size() > kMaxAdaptInputs) {
    return {Code::InvalidArgument, "adapt step: more than " + std::to_string(kMaxAdaptInputs) + " custom inputs"};
  }
  if (timeout_ms <= 0) timeout_ms = peer.config().timeout_ms;
  const int size = peer.size();
  auto send = std::make_shared<std::vector<uint8_t>>(kWidth * sizeof(double));
  auto recv = std::make_shared<std::vector<uint8_t>>(kWidth * sizeof(double) * static_cast<size_t>(size));
  std::vector<double> row(kWidth, 0.0);
  Metrics& metrics = peer.metrics();
  row[kStepSeconds] = metrics.step_end(monotonic_ns());
  row[kSamples] = in.samples;
  row[kLinkRate] = metrics.mean_send_rate();
  row[kRequestedSize] = in.requested_size;
  row[kNoiseScale] = in.have_grad_stats ? in.noise_scale : 0;
  row[kSnr] = in.have_grad_stats ? in.snr : 0;
  row[kSyncMode] = static_cast<double>(engine.sync_mode());
  row[kStepIndex] = static_cast<double>(engine.steps());
  row[kInputCount] = static_cast<double>(in.inputs.size());
  row[kInputKeysHash] = keys_hash(in.inputs);
  size_t c = kInputsStart;
  for (const auto& [key, value] : in.inputs) row[c++] = value;
  std::copy_n(reinterpret_cast<const uint8_t*>(row.data()), send->size(), send->data());

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  Status gathered = internal_gather(peer, "adapt step", kAdaptOpName, 0, send, recv, DType::F64, kWidth,
                                    deadline, nullptr);
  // As after a blocking step mark: the wait for the other ranks belongs to no step.
  metrics.step_restart(monotonic_ns());
  if (!gathered.is_ok()) return gathered;
  std::vector<double> all(kWidth * static_cast<size_t>(size));
  std::copy_n(recv->data(), recv->size(), reinterpret_cast<uint8_t*>(all.data()));

  StepTable t;
  t.step = engine.steps();
  t.size = size;
  std::vector<double> seconds(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    seconds[static_cast<size_t>(r)] = column(all, r, kStepSeconds);
    t.samples.push_back(column(all, r, kSamples));
    t.link_bytes_per_second.push_back(column(all, r, kLinkRate));
  }
  t.step_seconds = seconds;
  metrics.record_step(seconds);
  for (int r = 1; r < size; ++r) {
    if (std::string why = disagreement(all, r); !why.empty()) return {Code::Mismatch, "adapt step: " + why};
  }
  t.requested_size = static_cast<int>(column(all, 0, kRequestedSize));
  t.noise_scale = column(all, 0, kNoiseScale);
  t.snr = column(all, 0, kSnr);
  t.sync_mode = engine.sync_mode();
  c = kInputsStart;
  for (const auto& [key, value] : in.inputs) {
    t.input_keys.push_back(key);
    std::vector<double> per_rank(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) per_rank[static_cast<size_t>(r)] = column(all, r, c);
    t.inputs.push_back(std::move(per_rank));
    ++c;
  }
  if (Status s = engine.step(t, actions); !s.is_ok()) return {s.code(), "adapt step: " + s.message()};
  if (table_out != nullptr) *table_out = t;
  for (Action& a : *actions) {
    if (a.kind != ActionKind::SetTopology) continue;
    if (Status s = apply_topology(peer, a, timeout_ms); !s.is_ok()) return s;
  }
  // After any explicit swap, so that the measurement compares against what is in force.
  for (Action& a : *actions) {
    if (a.kind != ActionKind::MeasureLinks) continue;
    if (Status s = apply_measure_links(peer, a, timeout_ms); !s.is_ok()) return s;
  }
  return {};
}

}  // namespace taiji
