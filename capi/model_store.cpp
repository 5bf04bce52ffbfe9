// The model store's C ABI (include/taiji/model_store.h): saves into this peer's store,
// one-sided requests to another rank's (runtime/model_service.h).
#include <taiji/taiji.h>

#include "handles.h"

namespace {

using namespace taiji_capi;

}  // namespace

extern "C" {

TAIJI_API taiji_status_t taiji_model_save(taiji_peer_t* peer, const char* name, const void* buf,
                                          size_t bytes, uint64_t version, uint64_t* saved) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (name == nullptr) return invalid(peer, "name is NULL");
  return guarded(peer, [&]() -> taiji_status_t {
    auto result = peer->impl->model_save(name, buf, bytes, version);
    if (!result.is_ok()) return record(peer, result.status());
    if (saved != nullptr) *saved = result.value();
    return TAIJI_OK;
  });
}

TAIJI_API taiji_status_t taiji_model_request(taiji_peer_t* peer, int rank, const char* name,
                                             uint64_t version, void* buf, size_t bytes,
                                             const taiji_op_options_t* options,
                                             taiji_request_t** request) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (name == nullptr) return invalid(peer, "name is NULL");
  return guarded(peer, [&]() -> taiji_status_t {
    // The options' checks and callback are a collective's; the version is the argument's.
    taiji::PostArgs args;
    args.kind = taiji::OpKind::Recv;
    taiji_status_t s = apply_options(peer, options, request == nullptr, &args);
    if (s != TAIJI_OK) return s;
    return post_and_finish(peer, request, [&] {
      return peer->impl->model_request(rank, name, version, buf, bytes, args.timeout_ms,
                                       std::move(args.callback));
    });
  });
}

}  // extern "C"
