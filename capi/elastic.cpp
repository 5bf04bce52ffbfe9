// Elastic membership: taiji_resize, taiji_shrink and what a process reads of its
// membership. The work is the runtime's (runtime/elastic.h); this checks the arguments.
#include <taiji/taiji.h>

#include "handles.h"

namespace {

using namespace taiji_capi;

// The checks both calls make; TAIJI_OK when the call may go on.
taiji_status_t check_call(taiji_peer_t* peer, const char* what, const taiji_op_options_t* options,
                          int64_t* timeout_ms) {
  taiji_op_options_t opt;
  if (taiji::Status s = read_options(options, &opt); !s.is_ok()) return record(peer, s);
  if (opt.timeout_ms < 0) return invalid(peer, "options.timeout_ms is negative");
  if (peer->impl->on_io_thread()) {
    return record(peer, {taiji::Code::InvalidArgument,
                         std::string(what) + " blocks; it cannot run from a completion callback"});
  }
  if (peer->impl->in_group()) {
    return record(peer, {taiji::Code::InvalidArgument,
                         std::string(what) + " blocks; it cannot run inside an open group"});
  }
  *timeout_ms = opt.timeout_ms;
  return TAIJI_OK;
}

}  // namespace

extern "C" {

taiji_status_t taiji_resize(taiji_peer_t* peer, int new_size, const taiji_op_options_t* options,
                            int* changed, int* detached) {
  if (changed != nullptr) *changed = 0;
  if (detached != nullptr) *detached = 0;
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(peer, [&]() -> taiji_status_t {
    if (new_size < 1) return invalid(peer, "new_size must be at least 1");
    int64_t timeout_ms = 0;
    if (taiji_status_t s = check_call(peer, "taiji_resize", options, &timeout_ms); s != TAIJI_OK) return s;
    auto outcome = peer->elastic->resize(&peer->impl, new_size, timeout_ms);
    if (!outcome.is_ok()) return record(peer, outcome.status());
    if (changed != nullptr) *changed = outcome.value().changed ? 1 : 0;
    if (detached != nullptr) *detached = outcome.value().detached ? 1 : 0;
    return TAIJI_OK;
  });
}

taiji_status_t taiji_shrink(taiji_peer_t* peer, const taiji_op_options_t* options, int* changed) {
  if (changed != nullptr) *changed = 0;
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(peer, [&]() -> taiji_status_t {
    int64_t timeout_ms = 0;
    if (taiji_status_t s = check_call(peer, "taiji_shrink", options, &timeout_ms); s != TAIJI_OK) return s;
    auto shrunk = peer->elastic->shrink(&peer->impl, timeout_ms);
    if (!shrunk.is_ok()) return record(peer, shrunk.status());
    if (changed != nullptr) *changed = shrunk.value() ? 1 : 0;
    return TAIJI_OK;
  });
}

uint64_t taiji_peer_cluster_version(const taiji_peer_t* peer) {
  return peer != nullptr && peer->impl ? peer->impl->cluster_version() : 0;
}

uint64_t taiji_peer_joined_version(const taiji_peer_t* peer) {
  return peer != nullptr && peer->elastic ? peer->elastic->joined_version() : 0;
}

int taiji_peer_requested_size(taiji_peer_t* peer) {
  if (peer == nullptr) return -1;
  try {
    return peer->elastic->requested_size(*peer->impl);
  } catch (...) {
    return 0;
  }
}

}  // extern "C"
