// The C ABI: argument checks, conversion to the runtime's types, and the exception
// barrier. No C++ exception leaves this file.
#include <taiji/taiji.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "monitor/log.h"
#include "runtime/config.h"
#include "runtime/peer.h"

#include "handles.h"

namespace {

#define TAIJI_SAME_CODE_(code, public_name, value, label) \
  static_assert(static_cast<int>(taiji::Code::code) == TAIJI_##public_name);
TAIJI_CODE_LIST(TAIJI_SAME_CODE_)
#undef TAIJI_SAME_CODE_
#define TAIJI_COUNT_CODE_(code, public_name, value, label) +1
#define TAIJI_COUNT_STATUS_(name, value, text) +1
static_assert(0 TAIJI_CODE_LIST(TAIJI_COUNT_CODE_) == 0 TAIJI_STATUS_LIST(TAIJI_COUNT_STATUS_),
              "a public status without an internal Code (or the other way round)");
#undef TAIJI_COUNT_STATUS_
#undef TAIJI_COUNT_CODE_
static_assert(static_cast<int>(taiji::DType::U64) == TAIJI_U64);
static_assert(static_cast<int>(taiji::DType::BF16) == TAIJI_BF16);
static_assert(static_cast<int>(taiji::RedOp::Avg) == TAIJI_AVG);

}  // namespace

namespace taiji_capi {

thread_local std::string init_error;

taiji_status_t to_c(const taiji::Status& s) { return static_cast<taiji_status_t>(s.code()); }

taiji_status_t record(taiji_peer_t* peer, const taiji::Status& s) {
  if (!s.is_ok()) {
    std::lock_guard<std::mutex> lock(peer->error_mu);
    peer->last_error = s.message();
  }
  return to_c(s);
}

taiji_status_t invalid(taiji_peer_t* peer, const char* what) {
  return record(peer, {taiji::Code::InvalidArgument, what});
}

taiji::Status read_options(const taiji_op_options_t* options, taiji_op_options_t* out) {
  *out = TAIJI_OP_OPTIONS_INIT;
  if (options == nullptr) return {};
  if (options->struct_size < sizeof(size_t) || options->struct_size > (1u << 16)) {
    return {taiji::Code::InvalidArgument,
            "options.struct_size is not set (use TAIJI_OP_OPTIONS_INIT)"};
  }
  std::memcpy(out, options, std::min(options->struct_size, sizeof(*out)));
  out->struct_size = sizeof(*out);
  return {};
}

taiji_status_t apply_options(taiji_peer_t* peer, const taiji_op_options_t* options, bool blocking,
                             taiji::PostArgs* args) {
  taiji_op_options_t opt;
  taiji::Status s = read_options(options, &opt);
  if (!s.is_ok()) return record(peer, s);
  if (opt.timeout_ms < 0) return invalid(peer, "options.timeout_ms is negative");
  if (blocking && peer->impl->on_io_thread()) {
    return invalid(peer, "a blocking call from a completion callback would deadlock; pass a request");
  }
  if (blocking && peer->impl->in_group()) {
    return invalid(peer, "a blocking call inside an open group would wait for the group's end; pass a request");
  }
  args->version = opt.version;
  args->timeout_ms = opt.timeout_ms;
  args->memory = opt.memory;
  args->stream = opt.stream;
  // A send or recv has no graph to choose: the pair exchanges the buffer directly.
  if (opt.topology != nullptr && !taiji::op_kind_p2p(args->kind)) args->topology = opt.topology;
  if (opt.callback != nullptr) {
    taiji_callback_t cb = opt.callback;
    void* user_data = opt.user_data;
    args->callback = [cb, user_data](const taiji::Status& st) {
      taiji::call_user_callback([cb, user_data, st] { cb(to_c(st), user_data); });
    };
  }
  return TAIJI_OK;
}

taiji_status_t finish_post(taiji_peer_t* peer, const Posted& posted,
                           std::unique_ptr<taiji_request> handle, taiji_request_t** request) {
  if (!posted.is_ok()) return record(peer, posted.status());
  if (request != nullptr) {
    *handle = {posted.value(), peer->impl->io_thread_id(), peer};
    *request = handle.release();
    return TAIJI_OK;
  }
  taiji::Status result;
  posted.value()->wait_for(-1, &result);
  return record(peer, result);
}

taiji_status_t post(taiji_peer_t* peer, taiji::PostArgs args, const taiji_op_options_t* options,
                    taiji_request_t** request) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(peer, [&]() -> taiji_status_t {
    taiji_status_t s = apply_options(peer, options, request == nullptr, &args);
    if (s != TAIJI_OK) return s;
    taiji_op_options_t opt;
    read_options(options, &opt);  // checked by apply_options
    if (opt.grad_stats != nullptr) {
      if (args.kind != taiji::OpKind::Allreduce) return invalid(peer, "options.grad_stats is for allreduce only");
      return post_and_finish(peer, request,
                             [&] { return post_with_grad_stats(peer, opt.grad_stats, std::move(args)); });
    }
    return post_and_finish(peer, request, [&] { return peer->impl->post(std::move(args)); });
  });
}

}  // namespace taiji_capi

namespace {

using namespace taiji_capi;

taiji_status_t post_typed(taiji_peer_t* peer, taiji::OpKind kind, const char* name,
                          const void* sendbuf, void* recvbuf, size_t count, taiji_dtype_t dtype,
                          taiji_reduce_op_t op, int root, const taiji_op_options_t* options,
                          taiji_request_t** request) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (name == nullptr) return invalid(peer, "name is NULL");
  if (!taiji::valid_dtype(static_cast<uint32_t>(dtype))) return invalid(peer, "unknown dtype");
  if (!taiji::valid_redop(static_cast<uint32_t>(op))) return invalid(peer, "unknown reduce op");
  taiji::PostArgs args;
  args.kind = kind;
  args.name = name;
  args.send = sendbuf;
  args.recv = recvbuf;
  args.count = count;
  args.dtype = static_cast<taiji::DType>(dtype);
  args.redop = static_cast<taiji::RedOp>(op);
  args.root = root;
  return post(peer, std::move(args), options, request);
}

}  // namespace

extern "C" {

const char* taiji_status_name(taiji_status_t status) {
  switch (status) {
#define TAIJI_STATUS_NAME_(name, value, text) \
  case TAIJI_##name:                          \
    return "TAIJI_" #name;
    TAIJI_STATUS_LIST(TAIJI_STATUS_NAME_)
#undef TAIJI_STATUS_NAME_
  }
  return "TAIJI_UNKNOWN_STATUS";
}

const char* taiji_status_string(taiji_status_t status) {
  switch (status) {
#define TAIJI_STATUS_TEXT_(name, value, text) \
  case TAIJI_##name:                          \
    return text;
    TAIJI_STATUS_LIST(TAIJI_STATUS_TEXT_)
#undef TAIJI_STATUS_TEXT_
  }
  return "unknown status";
}

uint32_t taiji_version(void) { return TAIJI_VERSION_NUMBER; }

const char* taiji_version_string(void) {
#define TAIJI_STR2_(x) #x
#define TAIJI_STR_(x) TAIJI_STR2_(x)
  return TAIJI_STR_(TAIJI_VERSION_MAJOR) "." TAIJI_STR_(TAIJI_VERSION_MINOR) "." TAIJI_STR_(
      TAIJI_VERSION_PATCH);
}

taiji_status_t taiji_peer_init_versioned(uint32_t header_version, const taiji_config_t* config,
                                         taiji_peer_t** peer) {
  using taiji_capi::init_error;
  init_error.clear();
  if (peer == nullptr) {
    init_error = "peer output pointer is NULL";
    return TAIJI_ERR_INVALID_ARGUMENT;
  }
  *peer = nullptr;
  auto fail = [](taiji_status_t code, std::string message) {
    init_error = std::move(message);
    return code;
  };
  if (header_version / 10000 != TAIJI_VERSION_MAJOR || header_version > TAIJI_VERSION_NUMBER) {
    return fail(TAIJI_ERR_VERSION, "built against taiji header " + std::to_string(header_version) +
                                       ", library is " + std::to_string(TAIJI_VERSION_NUMBER));
  }
  try {
    taiji::Config explicit_values;
    if (config != nullptr) {
      taiji_config_t c = TAIJI_CONFIG_INIT;
      if (config->struct_size < sizeof(size_t) || config->struct_size > (1u << 16)) {
        return fail(TAIJI_ERR_INVALID_ARGUMENT, "config.struct_size is not set (use TAIJI_CONFIG_INIT)");
      }
      std::memcpy(&c, config, std::min(config->struct_size, sizeof(c)));
      // A struct that ends inside the settings pointer copied only part of it.
      if (!has_settings_field(config)) c.settings = nullptr;
      explicit_values.rank = c.rank;
      explicit_values.size = c.size;
      if (c.rendezvous != nullptr) explicit_values.rendezvous = c.rendezvous;
      explicit_values.host_rendezvous = c.host_rendezvous;
      if (c.listen_host != nullptr) explicit_values.listen_host = c.listen_host;
      if (c.job_id != nullptr) explicit_values.job_id = c.job_id;
      if (c.timeout_ms < 0 || c.init_timeout_ms < 0) {
        return fail(TAIJI_ERR_INVALID_ARGUMENT, "config timeouts must not be negative");
      }
      explicit_values.timeout_ms = c.timeout_ms;
      explicit_values.init_timeout_ms = c.init_timeout_ms;
      if (c.topology != nullptr) explicit_values.topology = c.topology;
      if (taiji::Status st = apply_settings(c, &explicit_values); !st.is_ok()) {
        return fail(to_c(st), st.message());
      }
    }
    auto resolved = taiji::resolve_config(explicit_values, taiji::process_env());
    if (!resolved.is_ok()) return fail(to_c(resolved.status()), resolved.status().message());
    auto made = taiji::Peer::create(resolved.value());
    if (!made.is_ok()) return fail(to_c(made.status()), made.status().message());
    *peer = make_handle(std::move(made.value())).release();
    return TAIJI_OK;
  } catch (const std::bad_alloc&) {
    return fail(TAIJI_ERR_NO_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(TAIJI_ERR_INTERNAL, e.what());
  }
}

taiji_status_t(taiji_peer_init)(const taiji_config_t* config, taiji_peer_t** peer) {
  return taiji_peer_init_versioned(TAIJI_VERSION_NUMBER, config, peer);
}

taiji_status_t taiji_peer_finalize(taiji_peer_t* peer) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(peer, [&] {
    taiji::Status s = peer->impl->finalize();
    // A peer that was aborted finalizes fine: the abort was the caller's own choice.
    if (s.code() == taiji::Code::Aborted) return TAIJI_OK;
    return record(peer, s);
  });
}

taiji_status_t taiji_peer_abort(taiji_peer_t* peer) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(peer, [&] {
    peer->impl->abort();
    return TAIJI_OK;
  });
}

void taiji_peer_destroy(taiji_peer_t* peer) {
  if (peer == nullptr) return;
  if (peer->impl && peer->impl->on_io_thread()) {
    // Freeing the loop that is running this callback would end the process. The peer is
    // aborted instead and its memory left: the caller broke the rule, the job goes on.
    taiji::log().error("taiji_peer_destroy from a completion callback: the peer is aborted, not freed");
    peer->impl->abort();
    return;
  }
  try {
    peer->impl.reset();
  } catch (...) {
    // Destruction must not throw into C; nothing more can be done for this peer.
  }
  delete peer;
}

int taiji_peer_rank(const taiji_peer_t* peer) { return peer && peer->impl ? peer->impl->rank() : -1; }
int taiji_peer_size(const taiji_peer_t* peer) { return peer && peer->impl ? peer->impl->size() : -1; }

taiji_status_t taiji_peer_async_error(const taiji_peer_t* peer) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return to_c(peer->impl->async_error());
}

const char* taiji_peer_last_error(const taiji_peer_t* peer) {
  if (peer == nullptr) return taiji_capi::init_error.c_str();
  auto* p = const_cast<taiji_peer_t*>(peer);
  std::lock_guard<std::mutex> lock(p->error_mu);
  try {
    std::string& copy = p->error_copies[std::this_thread::get_id()];
    copy = p->last_error;
    return copy.c_str();
  } catch (const std::bad_alloc&) {
    return "out of memory (copying the last error)";
  }
}

taiji_status_t taiji_allreduce(taiji_peer_t* peer, const char* name, const void* sendbuf,
                               void* recvbuf, size_t count, taiji_dtype_t dtype,
                               taiji_reduce_op_t op, const taiji_op_options_t* options,
                               taiji_request_t** request) {
  return post_typed(peer, taiji::OpKind::Allreduce, name, sendbuf, recvbuf, count, dtype, op, 0,
                    options, request);
}

taiji_status_t taiji_broadcast(taiji_peer_t* peer, const char* name, void* buf, size_t count,
                               taiji_dtype_t dtype, int root, const taiji_op_options_t* options,
                               taiji_request_t** request) {
  return post_typed(peer, taiji::OpKind::Broadcast, name, buf, buf, count, dtype, TAIJI_SUM, root,
                    options, request);
}

taiji_status_t taiji_barrier(taiji_peer_t* peer, const char* name,
                             const taiji_op_options_t* options, taiji_request_t** request) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (name == nullptr) return invalid(peer, "name is NULL");
  taiji::PostArgs args;
  args.kind = taiji::OpKind::Barrier;
  args.name = name;
  args.dtype = taiji::DType::U8;
  return post(peer, std::move(args), options, request);
}

taiji_status_t taiji_allgather(taiji_peer_t* peer, const char* name, const void* sendbuf,
                               void* recvbuf, size_t count, taiji_dtype_t dtype,
                               const taiji_op_options_t* options, taiji_request_t** request) {
  return post_typed(peer, taiji::OpKind::Allgather, name, sendbuf, recvbuf, count, dtype, TAIJI_SUM,
                    0, options, request);
}

taiji_status_t taiji_reduce(taiji_peer_t* peer, const char* name, const void* sendbuf, void* recvbuf,
                            size_t count, taiji_dtype_t dtype, taiji_reduce_op_t op, int root,
                            const taiji_op_options_t* options, taiji_request_t** request) {
  return post_typed(peer, taiji::OpKind::Reduce, name, sendbuf, recvbuf, count, dtype, op, root,
                    options, request);
}

taiji_status_t taiji_gather(taiji_peer_t* peer, const char* name, const void* sendbuf, void* recvbuf,
                            size_t count, taiji_dtype_t dtype, int root,
                            const taiji_op_options_t* options, taiji_request_t** request) {
  return post_typed(peer, taiji::OpKind::Gather, name, sendbuf, recvbuf, count, dtype, TAIJI_SUM,
                    root, options, request);
}

taiji_status_t taiji_reduce_scatter(taiji_peer_t* peer, const char* name, const void* sendbuf,
                                    void* recvbuf, size_t recvcount, taiji_dtype_t dtype,
                                    taiji_reduce_op_t op, const taiji_op_options_t* options,
                                    taiji_request_t** request) {
  return post_typed(peer, taiji::OpKind::ReduceScatter, name, sendbuf, recvbuf, recvcount, dtype,
                    op, 0, options, request);
}

taiji_status_t taiji_consensus(taiji_peer_t* peer, const char* name, const void* buf, size_t bytes,
                               int* agree, const taiji_op_options_t* options,
                               taiji_request_t** request) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (name == nullptr) return invalid(peer, "name is NULL");
  taiji::PostArgs args;
  args.kind = taiji::OpKind::Consensus;
  args.name = name;
  args.send = buf;
  args.count = bytes;
  args.dtype = taiji::DType::U8;
  args.redop = taiji::RedOp::Min;
  args.agree = agree;
  return post(peer, std::move(args), options, request);
}

taiji_status_t taiji_request_test(taiji_request_t* request) {
  if (request == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  taiji::Status s;
  return request->state->test(&s) ? to_c(s) : TAIJI_IN_PROGRESS;
}

taiji_status_t taiji_request_wait(taiji_request_t* request, int64_t timeout_ms) {
  if (request == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  taiji::Status s;
  // A finished op is answered on any thread. (The I/O thread's id, copied at the post,
  // may belong to a new thread once the peer is gone.)
  if (request->state->test(&s)) return to_c(s);
  if (request->io_thread == std::this_thread::get_id()) {
    return invalid(request->peer, "taiji_request_wait on the peer's own I/O thread (in a callback) would never return");
  }
  if (request->state->held_by(taiji::group_thread_token())) {
    return invalid(request->peer, "the op is held in a group this thread has still open; call taiji_group_end first");
  }
  return request->state->wait_for(timeout_ms, &s) ? to_c(s) : TAIJI_IN_PROGRESS;
}

taiji_status_t taiji_group_start(taiji_peer_t* peer) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(peer, [&]() -> taiji_status_t {
    peer->impl->group_start();
    return TAIJI_OK;
  });
}

taiji_status_t taiji_group_end(taiji_peer_t* peer) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(peer, [&]() -> taiji_status_t { return record(peer, peer->impl->group_end()); });
}

uint64_t taiji_request_topology_digest(const taiji_request_t* request) {
  return request ? request->state->topology_digest() : 0;
}

const char* taiji_request_error(const taiji_request_t* request) {
  return request ? request->state->error_text() : "";
}

uint64_t taiji_request_version(const taiji_request_t* request) {
  return request ? request->state->version() : 0;
}

void taiji_request_free(taiji_request_t* request) { delete request; }

}  // extern "C"
