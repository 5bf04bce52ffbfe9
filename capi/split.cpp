// Sub-groups: taiji_peer_split. The work is the runtime's (runtime/peer_split.cpp); this
// checks the arguments and wraps the child in a handle of its own.
#include <taiji/taiji.h>

#include <memory>

#include "handles.h"

extern "C" {

taiji_status_t taiji_peer_split(taiji_peer_t* peer, int color, int key,
                                const taiji_op_options_t* options, taiji_peer_t** child) {
  using namespace taiji_capi;
  if (child != nullptr) *child = nullptr;
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (child == nullptr) return invalid(peer, "child output pointer is NULL");
  return guarded(peer, [&]() -> taiji_status_t {
    taiji_op_options_t opt;
    if (taiji::Status s = read_options(options, &opt); !s.is_ok()) return record(peer, s);
    if (opt.timeout_ms < 0) return invalid(peer, "options.timeout_ms is negative");
    if (peer->impl->on_io_thread()) {
      return invalid(peer, "taiji_peer_split blocks; it cannot run from a completion callback");
    }
    if (peer->impl->in_group()) {
      return invalid(peer, "taiji_peer_split blocks; it cannot run inside an open group");
    }
    // Allocated before the split: once the child has joined its job, nothing may fail.
    auto handle = std::make_unique<taiji_peer>();
    handle->elastic = std::make_unique<taiji::Elastic>(peer->impl->cluster_version());
    auto made = peer->impl->split(color, key, opt.timeout_ms);
    if (!made.is_ok()) return record(peer, made.status());
    if (!made.value()) return TAIJI_OK;
    handle->impl = std::move(made.value());
    *child = handle.release();
    return TAIJI_OK;
  });
}

}  // extern "C"
