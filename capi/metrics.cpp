// The monitoring part of the C ABI (include/taiji/metrics.h).
#include <taiji/taiji.h>

#include <cstring>
#include <string>

#include "monitor/metrics.h"
#include "runtime/peer.h"

#include "handles.h"

namespace {

using namespace taiji_capi;

// The text output rule of metrics.h.
taiji_status_t copy_out(taiji_peer_t* peer, const std::string& text, char* buf, size_t len,
                        size_t* needed) {
  if (needed != nullptr) *needed = text.size() + 1;
  if (buf == nullptr || len < text.size() + 1) {
    return invalid(peer, ("the buffer holds " + std::to_string(buf == nullptr ? 0 : len) +
                          " bytes; the text needs " + std::to_string(text.size() + 1)).c_str());
  }
  std::memcpy(buf, text.c_str(), text.size() + 1);
  return TAIJI_OK;
}

}  // namespace

extern "C" {

TAIJI_API taiji_status_t taiji_metrics_json(taiji_peer_t* peer, char* buf, size_t len, size_t* needed) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(peer, [&] { return copy_out(peer, peer->impl->metrics().json(), buf, len, needed); });
}

TAIJI_API taiji_status_t taiji_flight_recorder_json(taiji_peer_t* peer, char* buf, size_t len,
                                                    size_t* needed) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(peer, [&] {
    return copy_out(peer, peer->impl->metrics().flight_json("requested"), buf, len, needed);
  });
}

TAIJI_API taiji_status_t taiji_metrics_set_enabled(taiji_peer_t* peer, int enabled) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  peer->impl->metrics().set_enabled(enabled != 0);
  return TAIJI_OK;
}

TAIJI_API taiji_status_t taiji_metrics_address(taiji_peer_t* peer, char* buf, size_t len,
                                               size_t* needed) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(peer, [&] { return copy_out(peer, peer->impl->metrics_address(), buf, len, needed); });
}

TAIJI_API taiji_status_t taiji_metrics_probe_rtt(taiji_peer_t* peer, int64_t timeout_ms) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (timeout_ms <= 0) return invalid(peer, "timeout_ms must be positive");
  return guarded(peer, [&] { return record(peer, peer->impl->probe_rtt(timeout_ms)); });
}

TAIJI_API taiji_status_t taiji_step_mark(taiji_peer_t* peer, const taiji_op_options_t* options,
                                         taiji_request_t** request) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(peer, [&]() -> taiji_status_t {
    taiji::PostArgs args;
    taiji_status_t s = apply_options(peer, options, request == nullptr, &args);
    if (s != TAIJI_OK) return s;
    s = post_and_finish(peer, request,
                        [&] { return peer->impl->step_mark(args.timeout_ms, std::move(args.callback)); });
    // A blocking mark's own wait for the other ranks belongs to no step.
    if (request == nullptr) peer->impl->metrics().step_restart(taiji::monotonic_ns());
    return s;
  });
}

}  // extern "C"
