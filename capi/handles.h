// What the C handles hold, and the helpers the C API files share.
#pragma once

#include <taiji/taiji.h>

#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "runtime/elastic.h"
#include "runtime/peer.h"

struct taiji_peer {
  // Rank and size are the membership's (they change with it): read through impl.
  // Replaced by taiji_resize and taiji_shrink with the new membership's peer.
  std::unique_ptr<taiji::Peer> impl;
  // What outlives each membership: the version this process joined at, the store client.
  std::unique_ptr<taiji::Elastic> elastic;
  std::mutex error_mu;
  std::string last_error;
  // What taiji_peer_last_error returned to each thread: valid until that thread's next call
  // on this peer, whatever other peers or threads do meanwhile. One entry per thread that
  // ever asked (thread ids are reused: about as many as threads live at once).
  std::map<std::thread::id, std::string> error_copies;
};

struct taiji_request {
  std::shared_ptr<taiji::RequestState> state;
  // The owning peer's I/O thread: waiting there would stop the loop that completes it.
  std::thread::id io_thread;
  // For the text of a misuse error; read only while the op is held in an open group
  // (the peer is then alive: closing it ends every hold).
  taiji_peer_t* peer = nullptr;
};

struct taiji_topology {
  taiji::BoundStrategy bound;
  int size = 0;
};

namespace taiji_capi {

// A handle for a peer that has just joined its job.
inline std::unique_ptr<taiji_peer> make_handle(std::unique_ptr<taiji::Peer> impl) {
  auto handle = std::make_unique<taiji_peer>();
  handle->elastic = std::make_unique<taiji::Elastic>(impl->cluster_version());
  handle->impl = std::move(impl);
  return handle;
}

// Text of the last failed call that had no peer to keep it (init, topology creation).
extern thread_local std::string init_error;

taiji_status_t to_c(const taiji::Status& s);
// Keeps a failure's text as the peer's last error; returns the status as a C code.
taiji_status_t record(taiji_peer_t* peer, const taiji::Status& s);
taiji_status_t invalid(taiji_peer_t* peer, const char* what);
taiji::Status read_options(const taiji_op_options_t* options, taiji_op_options_t* out);
// Copies version, timeout, topology and callback from the options into args.
taiji_status_t apply_options(taiji_peer_t* peer, const taiji_op_options_t* options, bool blocking,
                             taiji::PostArgs* args);
using Posted = taiji::Result<std::shared_ptr<taiji::RequestState>>;
// Applies the options to args (checked first) and posts the op, with its gradient
// statistics when it has some (allreduce only); finishes as finish_post does.
taiji_status_t post(taiji_peer_t* peer, taiji::PostArgs args, const taiji_op_options_t* options,
                    taiji_request_t** request);
// Hands the request to the caller, or waits for it when the caller passed none.
taiji_status_t finish_post(taiji_peer_t* peer, const Posted& posted,
                           std::unique_ptr<taiji_request> handle, taiji_request_t** request);
// Posts through post_op and finishes the post. The caller's handle is allocated first:
// once the op is posted nothing may fail, or the caller would be told of a failure (out
// of memory) for an op that runs.
template <typename PostFn>
taiji_status_t post_and_finish(taiji_peer_t* peer, taiji_request_t** request, PostFn&& post_op) {
  std::unique_ptr<taiji_request> handle;
  if (request != nullptr) handle = std::make_unique<taiji_request>();
  return finish_post(peer, post_op(), std::move(handle), request);
}

// Posts an allreduce with its gradient statistics (capi/grad_stats.cpp).
taiji::Result<std::shared_ptr<taiji::RequestState>> post_with_grad_stats(
    taiji_peer_t* peer, taiji_grad_stats_t* stats, taiji::PostArgs args);

// The peer a gradient-statistics object was created on (capi/grad_stats.cpp).
taiji_peer_t* grad_stats_peer(const taiji_grad_stats_t* stats);

// Applies the keys set by taiji_config_set over the explicit values (capi/config.cpp).
taiji::Status apply_settings(const taiji_config_t& config, taiji::Config* out);
// Whether the caller's struct_size covers the whole settings field (an older header's
// struct ends before it, or the size is bogus).
bool has_settings_field(const taiji_config_t* config);

// Runs fn, turning any escaping exception into a status.
template <typename Fn>
taiji_status_t guarded(taiji_peer_t* peer, Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return peer ? record(peer, {taiji::Code::NoMemory, "out of memory"}) : TAIJI_ERR_NO_MEMORY;
  } catch (const std::exception& e) {
    return peer ? record(peer, {taiji::Code::Internal, e.what()}) : TAIJI_ERR_INTERNAL;
  } catch (...) {
    return peer ? record(peer, {taiji::Code::Internal, "unknown exception"}) : TAIJI_ERR_INTERNAL;
  }
}

}  // namespace taiji_capi
