// Point-to-point: taiji_send and taiji_recv.
#include <taiji/taiji.h>

#include "handles.h"

extern "C" {

taiji_status_t taiji_send(taiji_peer_t* peer, const char*, const void*, size_t, taiji_dtype_t, int,
                          const taiji_op_options_t*, taiji_request_t** request) {
  if (request != nullptr) *request = nullptr;
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return taiji_capi::record(peer, {taiji::Code::Unsupported, "taiji_send is not built yet"});
}

taiji_status_t taiji_recv(taiji_peer_t* peer, const char*, void*, size_t, taiji_dtype_t, int,
                          const taiji_op_options_t*, taiji_request_t** request) {
  if (request != nullptr) *request = nullptr;
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return taiji_capi::record(peer, {taiji::Code::Unsupported, "taiji_recv is not built yet"});
}

}  // extern "C"
