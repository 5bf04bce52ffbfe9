// Sub-groups: taiji_peer_split.
#include <taiji/taiji.h>

#include "handles.h"

extern "C" {

taiji_status_t taiji_peer_split(taiji_peer_t* peer, int, int, const taiji_op_options_t*,
                                taiji_peer_t** child) {
  if (child != nullptr) *child = nullptr;
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return taiji_capi::record(peer, {taiji::Code::Unsupported, "taiji_peer_split is not built yet"});
}

}  // extern "C"
