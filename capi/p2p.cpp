// Point-to-point: taiji_send and taiji_recv. Each side is an op of its own kind (send or
// recv) posted like a collective, so matching, chunking, deadlines, early arrivals and
// groups are the engine's; only the pair takes part (runtime/p2p_key.h).
#include <taiji/taiji.h>

#include "handles.h"

namespace {

using namespace taiji_capi;

taiji_status_t post_p2p(taiji_peer_t* peer, taiji::OpKind kind, const char* name, const void* send,
                        void* recv, size_t count, taiji_dtype_t dtype, int other,
                        const taiji_op_options_t* options, taiji_request_t** request) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (name == nullptr) return invalid(peer, "name is NULL");
  if (!taiji::valid_dtype(static_cast<uint32_t>(dtype))) return invalid(peer, "unknown dtype");
  // Copying the name may throw: no exception leaves for C. The dtype goes in by value: a
  // parameter captured by reference is read back from memory, where UBSan checks an
  // enum's range, and the invalid values the check above refuses would trip it.
  return guarded(peer, [&, dt = static_cast<taiji::DType>(static_cast<uint32_t>(dtype))]() -> taiji_status_t {
    taiji::PostArgs args;
    args.kind = kind;
    args.name = name;
    args.send = send;
    args.recv = recv;
    args.count = count;
    args.dtype = dt;
    args.peer = other;
    return post(peer, std::move(args), options, request);
  });
}

}  // namespace

extern "C" {

taiji_status_t taiji_send(taiji_peer_t* peer, const char* name, const void* buf, size_t count,
                          taiji_dtype_t dtype, int dst, const taiji_op_options_t* options,
                          taiji_request_t** request) {
  return post_p2p(peer, taiji::OpKind::Send, name, buf, nullptr, count, dtype, dst, options, request);
}

taiji_status_t taiji_recv(taiji_peer_t* peer, const char* name, void* buf, size_t count,
                          taiji_dtype_t dtype, int src, const taiji_op_options_t* options,
                          taiji_request_t** request) {
  return post_p2p(peer, taiji::OpKind::Recv, name, nullptr, buf, count, dtype, src, options, request);
}

}  // extern "C"
