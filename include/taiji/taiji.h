/*
 * taiji: named, versioned, asynchronous collectives for distributed training.
 *
 * The whole public contract is this header. Conventions that hold for every function:
 *  - Functions return taiji_status_t: 0 success, positive values are not errors
 *    (TAIJI_IN_PROGRESS), negative values are errors with fixed numbers.
 *  - A function that fails changes nothing and, if it takes a callback, never calls it.
 *  - Handles are opaque. taiji_*_destroy / taiji_request_free accept NULL.
 *  - Thread safety: every function taking a taiji_peer_t* may be called from any thread,
 *    concurrently, unless its comment says otherwise.
 *  - The text behind taiji_peer_last_error is per peer; no global state exists, so several
 *    peers may live in one process.
 */
#ifndef TAIJI_TAIJI_H
#define TAIJI_TAIJI_H

#include <stddef.h>
#include <stdint.h>

#include <taiji/version.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define TAIJI_API __attribute__((visibility("default")))
#else
#define TAIJI_API
#endif

/* ---- status codes ------------------------------------------------------------------- */

/* X(NAME, value, description). Values are fixed forever; retired ones are never reused. */
#define TAIJI_STATUS_LIST(X)                                                             \
  X(OK, 0, "success")                                                                    \
  X(IN_PROGRESS, 1, "operation still in progress")                                      \
  X(ERR_INVALID_ARGUMENT, -1, "invalid argument")                                       \
  X(ERR_NO_MEMORY, -2, "out of memory")                                                  \
  X(ERR_TIMEOUT, -3, "operation timed out")                                              \
  X(ERR_MISMATCH, -4, "peers disagree on an operation's parameters")                    \
  X(ERR_PEER_LOST, -5, "a peer was lost")                                                \
  X(ERR_DUPLICATE, -6, "operation with this name and version is already in flight")     \
  X(ERR_STALE_VERSION, -7, "version already completed for this name")                   \
  X(ERR_PROTOCOL, -8, "protocol error")                                                  \
  X(ERR_IO, -9, "system or network I/O error")                                           \
  X(ERR_CONFIG, -10, "invalid configuration")                                            \
  X(ERR_ABORTED, -11, "aborted")                                                         \
  X(ERR_FINALIZED, -12, "peer is finalized or failed")                                   \
  X(ERR_VERSION, -13, "header and library versions are incompatible")                   \
  X(ERR_INTERNAL, -14, "internal error")                                                 \
  X(ERR_UNSUPPORTED, -15, "not supported")                                               \
  X(ERR_BOOTSTRAP, -16, "bootstrap (rendezvous or connection set-up) failed")             \
  X(ERR_AUTH, -17, "authentication failed (a different or no job secret)")               \
  X(ERR_NOT_FOUND, -18, "no such name or version")                                      \
  X(ERR_NO_DEVICE, -19, "device memory, but no usable GPU or NCCL")

typedef enum taiji_status {
#define TAIJI_STATUS_ENUM_(name, value, text) TAIJI_##name = value,
  TAIJI_STATUS_LIST(TAIJI_STATUS_ENUM_)
#undef TAIJI_STATUS_ENUM_
} taiji_status_t;

/* "TAIJI_ERR_TIMEOUT" etc.; "TAIJI_UNKNOWN_STATUS" for other values. Static strings. */
TAIJI_API const char *taiji_status_name(taiji_status_t status);
/* A short English description. Static string. */
TAIJI_API const char *taiji_status_string(taiji_status_t status);

/* ---- element types and reduction operators ------------------------------------------ */

typedef enum taiji_dtype {
  TAIJI_F32 = 0,
  TAIJI_F64 = 1,
  TAIJI_F16 = 2,  /* IEEE 754 binary16; reduced in f32, rounded to nearest-even per step */
  TAIJI_BF16 = 3, /* bfloat16; reduced in f32, rounded to nearest-even per step */
  TAIJI_I8 = 4,
  TAIJI_U8 = 5,
  TAIJI_I32 = 6,
  TAIJI_U32 = 7,
  TAIJI_I64 = 8,
  TAIJI_U64 = 9
} taiji_dtype_t;

typedef enum taiji_reduce_op {
  TAIJI_SUM = 0,  /* integers wrap modulo 2^bits */
  TAIJI_PROD = 1, /* integers wrap modulo 2^bits */
  TAIJI_MIN = 2,  /* as std::min (and MAX as std::max): a NaN input may or may not */
  TAIJI_MAX = 3,  /* survive, depending on its rank; SUM always carries it         */
  TAIJI_AVG = 4   /* sum, then divided by the world size (integers: truncated) */
} taiji_reduce_op_t;

/* ---- handles ------------------------------------------------------------------------ */

typedef struct taiji_peer taiji_peer_t;       /* one process's membership in a job */
typedef struct taiji_request taiji_request_t; /* one posted asynchronous operation */

/* Completion callback. Runs on the peer's I/O thread exactly once when the op completes
 * (successfully or not); it must not block and must not wait on other taiji requests. It
 * may post new operations with a request (a blocking call or a wait made from a callback
 * returns TAIJI_ERR_INVALID_ARGUMENT instead of deadlocking the I/O thread).
 * The callback is not ordered with the caller's view of the op: taiji_request_wait,
 * taiji_request_test or a blocking call may report completion before the callback has
 * run (a thread that waited runs the loop itself and leaves callbacks to the I/O thread).
 * Keep user_data valid until the callback has run; taiji_peer_finalize and
 * taiji_peer_destroy run every callback still due before they return. */
typedef void (*taiji_callback_t)(taiji_status_t status, void *user_data);

/* ---- versions ----------------------------------------------------------------------- */

/* The library's TAIJI_VERSION_NUMBER (see <taiji/version.h>). */
TAIJI_API uint32_t taiji_version(void);
/* "0.2.0". Static string. */
TAIJI_API const char *taiji_version_string(void);

/* ---- peer lifecycle ----------------------------------------------------------------- */

typedef struct taiji_settings taiji_settings_t; /* keys set by taiji_config_set */

/* Peer configuration. Initialise with TAIJI_CONFIG_INIT, then set what you need: these
 * fields, or any setting by name with taiji_config_set. Unset fields (-1, 0 or NULL as
 * noted) are taken from the environment, then from defaults; see docs/environment.md.
 * Fields are only ever appended. */
typedef struct taiji_config {
  size_t struct_size;           /* sizeof(taiji_config_t), set by TAIJI_CONFIG_INIT */
  int32_t rank;                 /* -1: from environment */
  int32_t size;                 /* world size; -1: from environment */
  const char *rendezvous;       /* "host:port" of the rendezvous store; NULL: environment */
  int32_t host_rendezvous;      /* 1: this peer serves the store; 0: no; -1: automatic */
  const char *listen_host;      /* address to listen on and advertise; NULL: environment */
  const char *job_id;           /* peers of one job must agree; NULL: environment */
  int64_t timeout_ms;           /* default op deadline; 0: environment (default 60000) */
  int64_t init_timeout_ms;      /* bootstrap deadline; 0: environment (default 60000) */
  const char *topology;         /* "ring", "tree", "star"; NULL: automatic by size */
  taiji_settings_t *settings;   /* owned by taiji_config_set / taiji_config_clear; NULL: none */
} taiji_config_t;

#define TAIJI_CONFIG_INIT \
  { sizeof(taiji_config_t), -1, -1, NULL, -1, NULL, NULL, 0, 0, NULL, NULL }

/* Sets one setting by its environment variable's name, e.g.
 * taiji_config_set(&config, "TAIJI_CHUNK_BYTES", "4M"): every variable of
 * docs/environment.md is a key, and takes the variable's text. A set key counts as an
 * explicit value: it wins over the environment and the defaults, and over the struct field
 * that fills the same setting (precedence: set key, then field, then environment, then
 * default). Setting a key again replaces its value; a NULL or empty value unsets it (as an
 * empty variable does). The value is parsed and checked at the call by the parser the
 * environment's value goes through; rules between settings (chunk size and max payload,
 * rank and world size) are checked by taiji_peer_init.
 * The config owns what this allocates until taiji_config_clear; copies of the struct share
 * it, so clear one of them, once. Never blocks. Not thread-safe for one config (calls on
 * different configs may run concurrently). On error nothing changes and
 * taiji_peer_last_error(NULL) on the calling thread says why. Errors:
 * ERR_INVALID_ARGUMENT (NULL config or key, a struct_size not from TAIJI_CONFIG_INIT of a
 * header that has this function, an unknown key, a bad value), ERR_NO_MEMORY,
 * ERR_INTERNAL. */
TAIJI_API taiji_status_t taiji_config_set(taiji_config_t *config, const char *key,
                                          const char *value);

/* Frees what taiji_config_set allocated and sets config->settings to NULL. Accepts NULL
 * and a config with nothing set. Never blocks. Not thread-safe for one config. A peer
 * made from the config keeps its own copy: clearing it after taiji_peer_init is fine. */
TAIJI_API void taiji_config_clear(taiji_config_t *config);

/* Creates a peer and joins the job: publishes this peer's address at the rendezvous,
 * connects to every other peer, and returns when all are connected or init_timeout_ms
 * passed. Blocks. `config` may be NULL (everything from the environment); it is copied,
 * its strings need not outlive the call. On error *peer is set to NULL and nothing is
 * left running. Errors: ERR_INVALID_ARGUMENT, ERR_CONFIG, ERR_BOOTSTRAP, ERR_TIMEOUT,
 * ERR_IO, ERR_AUTH (the peers' job secrets differ), ERR_VERSION, ERR_NO_MEMORY,
 * ERR_INTERNAL.
 * The macro passes the header's version so a mismatched library is a clear error; the
 * function of the same name is also exported for callers that bind symbols directly. */
TAIJI_API taiji_status_t taiji_peer_init_versioned(uint32_t header_version,
                                                   const taiji_config_t *config,
                                                   taiji_peer_t **peer);
TAIJI_API taiji_status_t(taiji_peer_init)(const taiji_config_t *config, taiji_peer_t **peer);
#define taiji_peer_init(config, peer) \
  taiji_peer_init_versioned(TAIJI_VERSION_NUMBER, (config), (peer))

/* Completes the peer's participation: waits (bounded by the op timeout) for in-flight ops
 * to finish, then closes all connections and stops the I/O thread. Ops posted afterwards
 * fail with ERR_FINALIZED. Blocks. Idempotent. Returns the peer's sticky error, if any;
 * after taiji_peer_abort it returns TAIJI_OK (there is nothing left to finish), unless
 * the peer had already failed before the abort: then that first error. */
TAIJI_API taiji_status_t taiji_peer_finalize(taiji_peer_t *peer);

/* Cancels every in-flight op (each completes with ERR_ABORTED, waking its waiters),
 * closes all connections and makes the peer unusable (taiji_peer_async_error reports
 * ERR_ABORTED, or the error the peer had already failed with, which is kept; later posts
 * fail; finalize returns TAIJI_OK, or that earlier error). Does not
 * wait for peers. Safe to call from any thread, also from a completion callback. */
TAIJI_API taiji_status_t taiji_peer_abort(taiji_peer_t *peer);

/* Frees the peer. If it was not finalized, ops still running fail with ERR_ABORTED and
 * the links close with a goodbye, so other peers see this one leave (ops that need it
 * fail with ERR_PEER_LOST) rather than crash. Requests still held by the caller stay
 * valid until freed. Accepts NULL. Do not call it from a completion callback (there it
 * only aborts the peer, logs an error and leaves the peer's memory allocated). */
TAIJI_API void taiji_peer_destroy(taiji_peer_t *peer);

/* Rank and world size; -1 for NULL. Never block. */
TAIJI_API int taiji_peer_rank(const taiji_peer_t *peer);
TAIJI_API int taiji_peer_size(const taiji_peer_t *peer);

/* The sticky asynchronous error of the peer: OK, or the error that made it unusable
 * (a lost connection, abort). Never blocks. */
TAIJI_API taiji_status_t taiji_peer_async_error(const taiji_peer_t *peer);

/* Text of the last error of a call on this peer (any thread), or of the last failed
 * taiji_peer_init or taiji_config_set when peer is NULL on the calling thread. The
 * pointer stays valid until the next call on the same peer from the same thread. Never
 * NULL. */
TAIJI_API const char *taiji_peer_last_error(const taiji_peer_t *peer);

/* ---- operation options -------------------------------------------------------------- */

typedef struct taiji_grad_stats taiji_grad_stats_t; /* see <taiji/grad_stats.h> */

typedef struct taiji_op_options {
  size_t struct_size;         /* sizeof(taiji_op_options_t), set by TAIJI_OP_OPTIONS_INIT */
  uint64_t version;           /* 0: automatic (per-name counter: n-th call is version n) */
  int64_t timeout_ms;         /* 0: the peer's default; the op fails with ERR_TIMEOUT after */
  taiji_callback_t callback;  /* optional; see taiji_callback_t */
  void *user_data;            /* passed to callback */
  const char *topology;       /* NULL: the peer's choice; else "ring", "tree", "star" */
  taiji_grad_stats_t *grad_stats; /* allreduce only: gradient statistics of this tensor */
  /* Appended fields: a caller built against an older header (a smaller struct_size) gets
     their defaults. */
  int memory;                 /* TAIJI_MEMORY_AUTO: where the buffers are found to live */
  void *stream;               /* device ops: the cudaStream_t the op is ordered against
                                 (NULL: the default stream); see taiji_memory_t */
} taiji_op_options_t;

#define TAIJI_OP_OPTIONS_INIT { sizeof(taiji_op_options_t), 0, 0, NULL, NULL, NULL, NULL, 0, NULL }

/* Where an op's buffers live, and so which backend runs it.
 *  AUTO:   device memory when the CUDA runtime says so (cudaPointerGetAttributes, only
 *          asked when a GPU is usable here), else host memory.
 *  HOST:   host memory; the host backend (TCP, shared memory) runs it.
 *  DEVICE: device memory; the device backend (NCCL) runs it.
 * A device op runs allreduce, broadcast, reduce, allgather or reduce_scatter; it is ordered
 * after the work queued on `stream` before the post, and work queued on `stream` after the
 * op completes runs after it. Errors at post: ERR_NO_DEVICE (no usable GPU or NCCL here,
 * the peer's last error says why; host ops are not affected), ERR_INVALID_ARGUMENT (send
 * and recv in different memories), ERR_UNSUPPORTED (an op kind NCCL does not run). */
typedef enum taiji_memory {
  TAIJI_MEMORY_AUTO = 0,
  TAIJI_MEMORY_HOST = 1,
  TAIJI_MEMORY_DEVICE = 2
} taiji_memory_t;

/* ---- collectives -------------------------------------------------------------------- *
 * Common rules:
 *  - `name` (1..TAIJI_MAX_NAME_LEN bytes of UTF-8, default 256, NUL-terminated; copied;
 *    names starting with "taiji." are reserved: ERR_INVALID_ARGUMENT) identifies the op; together
 *    with its version it matches the op across peers, whatever order peers post in.
 *  - `options` may be NULL (all defaults).
 *  - request == NULL: the call blocks until the op completes and returns its status.
 *    request != NULL: the call returns TAIJI_OK at once after posting, *request is set,
 *    and the op's outcome is read with taiji_request_test / taiji_request_wait.
 *  - Buffers belong to the runtime from the call until the op completes: do not read the
 *    output or write the input before completion.
 *  - Synchronous errors (nothing posted, no callback): ERR_INVALID_ARGUMENT,
 *    ERR_DUPLICATE (same name and version in flight), ERR_STALE_VERSION (version already
 *    completed for the name), ERR_FINALIZED, ERR_NO_MEMORY.
 *  - Asynchronous errors (reported by the request and callback): ERR_TIMEOUT,
 *    ERR_MISMATCH (peers posted the name with a different count, dtype, op, root or
 *    topology; for allreduce and barrier every peer gets it, for broadcast every peer
 *    next to the disagreement), ERR_PEER_LOST, ERR_ABORTED, ERR_PROTOCOL.
 */

/* recvbuf[i] = op over peers of sendbuf[i], for i < count. sendbuf == recvbuf is in-place.
 * count may be 0 (the op then only synchronises and checks agreement). */
TAIJI_API taiji_status_t taiji_allreduce(taiji_peer_t *peer, const char *name,
                                         const void *sendbuf, void *recvbuf, size_t count,
                                         taiji_dtype_t dtype, taiji_reduce_op_t op,
                                         const taiji_op_options_t *options,
                                         taiji_request_t **request);

/* Copies root's buf to every peer's buf (count elements). Pipelined over the topology. */
TAIJI_API taiji_status_t taiji_broadcast(taiji_peer_t *peer, const char *name, void *buf,
                                         size_t count, taiji_dtype_t dtype, int root,
                                         const taiji_op_options_t *options,
                                         taiji_request_t **request);

/* Completes on a peer only after every peer posted it. */
TAIJI_API taiji_status_t taiji_barrier(taiji_peer_t *peer, const char *name,
                                       const taiji_op_options_t *options,
                                       taiji_request_t **request);

/* recvbuf (size * count elements) = every rank's sendbuf (count elements) in rank order.
 * In-place: sendbuf == recvbuf + rank * count elements. Each rank's block is broadcast
 * over the topology from its owner (a ring gives the bandwidth-optimal ring allgather). */
TAIJI_API taiji_status_t taiji_allgather(taiji_peer_t *peer, const char *name,
                                         const void *sendbuf, void *recvbuf, size_t count,
                                         taiji_dtype_t dtype, const taiji_op_options_t *options,
                                         taiji_request_t **request);

/* recvbuf on root (count elements) = op over peers of sendbuf. recvbuf is not touched
 * and may be NULL on other ranks. sendbuf == recvbuf is in-place on the root. */
TAIJI_API taiji_status_t taiji_reduce(taiji_peer_t *peer, const char *name, const void *sendbuf,
                                      void *recvbuf, size_t count, taiji_dtype_t dtype,
                                      taiji_reduce_op_t op, int root,
                                      const taiji_op_options_t *options,
                                      taiji_request_t **request);

/* recvbuf on root (size * count elements) = every rank's sendbuf in rank order; recvbuf
 * may be NULL on other ranks. Blocks travel along the topology's paths to the root. */
TAIJI_API taiji_status_t taiji_gather(taiji_peer_t *peer, const char *name, const void *sendbuf,
                                      void *recvbuf, size_t count, taiji_dtype_t dtype, int root,
                                      const taiji_op_options_t *options,
                                      taiji_request_t **request);

/* sendbuf holds size * recvcount elements; recvbuf (recvcount elements) on rank r = op
 * over peers of block r of sendbuf. Each block is reduced toward its owner. */
TAIJI_API taiji_status_t taiji_reduce_scatter(taiji_peer_t *peer, const char *name,
                                              const void *sendbuf, void *recvbuf,
                                              size_t recvcount, taiji_dtype_t dtype,
                                              taiji_reduce_op_t op,
                                              const taiji_op_options_t *options,
                                              taiji_request_t **request);

/* Do all peers hold the same `bytes` bytes in buf? *agree is set to 1 (all equal) or 0
 * when the op completes; every peer gets the same answer. buf is only read. Peers
 * that pass a different length get ERR_MISMATCH. */
TAIJI_API taiji_status_t taiji_consensus(taiji_peer_t *peer, const char *name, const void *buf,
                                         size_t bytes, int *agree,
                                         const taiji_op_options_t *options,
                                         taiji_request_t **request);

/* ---- topologies ----------------------------------------------------------------------- *
 * A topology is a list of (reduce graph, broadcast graph) pairs over the ranks; chunk i
 * of a buffer runs on pair i mod P. Built-in names: star, ring, clique, tree, binary_tree,
 * binary_tree_star, multi_binary_tree_star, hierarchical (the host-aware ones group ranks
 * by listen address or TAIJI_HOST). Topology objects are immutable: any thread may use
 * them; none of these functions blocks. A failed creation sets *topology to NULL and
 * taiji_peer_last_error(NULL) (on the calling thread) names the fault; nothing else
 * changes. */

typedef struct taiji_topology taiji_topology_t;

/* From parent arrays: reduce_parents[p * size + r] is rank r's parent in pair p's reduce
 * graph (-1 marks its root), broadcast_parents likewise. Validated: right rank count,
 * exactly one root, every rank reaches it, no cycle, the broadcast graph rooted where its
 * reduce graph ends. Errors: ERR_INVALID_ARGUMENT. */
TAIJI_API taiji_status_t taiji_topology_from_parents(int size, int pairs, const int *reduce_parents,
                                                     const int *broadcast_parents,
                                                     taiji_topology_t **topology);

/* From edge lists: for pair p, reduce_edges[p * 2 * (size - 1) + 2 * e] is a child and the
 * next int its parent (size - 1 edges per graph); broadcast_edges likewise. */
TAIJI_API taiji_status_t taiji_topology_from_edges(int size, int pairs, const int *reduce_edges,
                                                   const int *broadcast_edges,
                                                   taiji_topology_t **topology);

/* A built-in name or the text form that taiji_topology_text writes. With a peer, built
 * for that peer's job (host-aware shapes use its hosts) and size may be 0; without one,
 * every rank counts as its own host, and a built-in name is made for at most 4096 ranks
 * (it holds up to size^2 entries). */
TAIJI_API taiji_status_t taiji_topology_from_text(const taiji_peer_t *peer, const char *text,
                                                  int size, taiji_topology_t **topology);

/* Writes the text form, NUL-terminated and cut to len bytes, and returns its full length
 * (without the NUL); buf may be NULL with len 0 to ask for the length. Returns 0 (and
 * writes an empty string) for NULL or when there is no memory to make the text. */
TAIJI_API size_t taiji_topology_text(const taiji_topology_t *topology, char *buf, size_t len);
/* 64-bit digest of the graphs, equal on every machine for equal graphs; 0 for NULL. */
TAIJI_API uint64_t taiji_topology_digest(const taiji_topology_t *topology);
TAIJI_API int taiji_topology_size(const taiji_topology_t *topology);
TAIJI_API void taiji_topology_destroy(taiji_topology_t *topology);

/* Swaps the topology while ops run. A collective: every peer calls it at the same point
 * of its op stream. The peers check by consensus that they proposed the same topology
 * (NULL: back to the automatic choice by size); then ops posted after this call, on
 * this peer, run on it, while ops already in flight finish on the old one. Peers that
 * disagree all get ERR_MISMATCH and keep the old topology. Ops posted after the call
 * wait for the agreement before they start. Blocking and asynchronous like any op;
 * options.timeout_ms bounds the agreement (options.version and options.topology are
 * ignored; options.grad_stats is refused with ERR_INVALID_ARGUMENT). The topology
 * object may be destroyed once the call returns. */
TAIJI_API taiji_status_t taiji_set_topology(taiji_peer_t *peer, const taiji_topology_t *topology,
                                            const taiji_op_options_t *options,
                                            taiji_request_t **request);

/* ---- groups ------------------------------------------------------------------------- *
 * Ops the calling thread posts between taiji_group_start and taiji_group_end on a peer
 * (collectives, taiji_set_topology, taiji_step_mark) are held, then handed to the peer
 * together when the group ends, as with NCCL's ncclGroupStart/End. Their requests are
 * returned at once, but nothing starts before the end, and their deadlines count from it.
 * A batch of small allreduces posted in one group is fused as a whole (TAIJI_FUSION=on)
 * instead of in the pieces the peer happened to see while the caller was still posting,
 * and costs one hand-over instead of one per op.
 *  - Groups belong to the calling thread and nest: only the outermost end hands over.
 *    Other threads' posts are not held: ops they post before the end start first (after a
 *    held taiji_set_topology, still on the old topology). A thread must end its groups
 *    before it exits; ops it leaves held wait until the peer closes, which fails them.
 *  - Inside a group, a blocking call (request == NULL) fails with ERR_INVALID_ARGUMENT
 *    (nothing posted): it would wait for an end that cannot come. So does
 *    taiji_request_wait on a held request from the thread holding it (the request stays
 *    valid; wait again after the end). taiji_request_test reports TAIJI_IN_PROGRESS.
 *  - A post inside a group still checks its arguments and fails at once as outside one.
 *    Until the end, other peers' stall warnings (TAIJI_STALL_WARN_MS) count it as not
 *    posted here.
 *  - Finalize, abort and destroy fail held ops (ERR_FINALIZED, ERR_ABORTED, ERR_ABORTED).
 *    Posts after that fail with ERR_FINALIZED as outside a group; the end then has nothing
 *    to hand over and returns TAIJI_OK. */

/* Opens a group (or one more level of it) on the calling thread. */
TAIJI_API taiji_status_t taiji_group_start(taiji_peer_t *peer);

/* Closes one level; the outermost hands the group's ops to the peer. ERR_INVALID_ARGUMENT
 * when the calling thread has no group open on this peer. */
TAIJI_API taiji_status_t taiji_group_end(taiji_peer_t *peer);

/* ---- requests ----------------------------------------------------------------------- *
 * A request is owned by the caller and must be freed once with taiji_request_free. It
 * may be tested and waited on from any thread. */

/* TAIJI_IN_PROGRESS while running, else the op's final status. Never blocks. */
TAIJI_API taiji_status_t taiji_request_test(taiji_request_t *request);

/* Waits up to timeout_ms (negative: until the op completes, which its own deadline
 * bounds). Returns the op's final status, or TAIJI_IN_PROGRESS if timeout_ms passed first
 * (the op goes on). Blocks; do not call from a completion callback. ERR_INVALID_ARGUMENT
 * at once for an op held in a group the calling thread has still open. */
TAIJI_API taiji_status_t taiji_request_wait(taiji_request_t *request, int64_t timeout_ms);

/* Digest of the topology the op runs on (see taiji_topology_digest), 0 before it started;
 * for taiji_set_topology, of the topology in force after it. Never blocks. */
TAIJI_API uint64_t taiji_request_topology_digest(const taiji_request_t *request);

/* Text of the op's error once it failed (it names the ranks and fields involved); "" while
 * it runs or when it succeeded. Valid as long as the request. Never NULL, never blocks. */
TAIJI_API const char *taiji_request_error(const taiji_request_t *request);

/* The op's version (useful with automatic versions). Never blocks. */
TAIJI_API uint64_t taiji_request_version(const taiji_request_t *request);

/* Releases the handle. If the op is still running it goes on (its callback still runs)
 * and its buffers stay in use until it completes. Accepts NULL. */
TAIJI_API void taiji_request_free(taiji_request_t *request);

/* ---- point-to-point ------------------------------------------------------------------ *
 * A send on rank s to rank d matches the recv on rank d from rank s with the same name
 * and version; nothing else takes part. Automatic versions (options.version == 0) count
 * per (name, direction, other rank): the n-th send of "x" to rank 3 is version n, and so
 * is the n-th recv of "x" from the rank that sends it. The names are those of the
 * collectives (same rules, same reserved prefix) but a separate space: a send "x" never
 * meets a collective "x". Both sides must pass the same count and dtype, or both fail with
 * ERR_MISMATCH. A send completes once the receiver has posted the matching recv and taken
 * the data (as MPI_Ssend). Deadlines, back-pressure (a sender far ahead of its receiver is
 * paused, as with early collective data), callbacks, groups and the request rules are
 * those of the collectives; options.topology is ignored (there is no graph: the data goes
 * straight to the partner), options.grad_stats is refused, and
 * taiji_request_topology_digest reports 0. dst == src == own rank is ERR_INVALID_ARGUMENT,
 * as is a rank out of range. Errors as for the collectives. */
TAIJI_API taiji_status_t taiji_send(taiji_peer_t *peer, const char *name, const void *buf,
                                    size_t count, taiji_dtype_t dtype, int dst,
                                    const taiji_op_options_t *options,
                                    taiji_request_t **request);
TAIJI_API taiji_status_t taiji_recv(taiji_peer_t *peer, const char *name, void *buf,
                                    size_t count, taiji_dtype_t dtype, int src,
                                    const taiji_op_options_t *options,
                                    taiji_request_t **request);

/* ---- sub-groups ---------------------------------------------------------------------- */

/* Splits the peer's job, like MPI_Comm_split or ncclCommSplit: a collective over `peer`
 * (every rank calls it, in the same order relative to its other splits). Ranks passing the
 * same color >= 0 form one child job, ranked by (key, parent rank); a rank passing a
 * negative color takes part but gets *child = NULL. The child is a peer like any other:
 * every collective, its own names and versions, its own topology and settings (copied
 * from the parent's configuration), and its own I/O thread and connections: it depends on
 * nothing of its parent, so either may be destroyed first. Blocks. options may be NULL; options.timeout_ms bounds the whole split (default: the
 * peer's op timeout); other fields are ignored. On error *child is NULL. Errors:
 * ERR_INVALID_ARGUMENT (NULL peer or child, a blocking call from a callback, inside a
 * group), ERR_TIMEOUT, ERR_PEER_LOST, ERR_BOOTSTRAP, ERR_FINALIZED, ERR_NO_MEMORY. */
TAIJI_API taiji_status_t taiji_peer_split(taiji_peer_t *peer, int color, int key,
                                          const taiji_op_options_t *options,
                                          taiji_peer_t **child);

/* ---- elastic membership --------------------------------------------------------------
 * A job's membership has a cluster version: 1 for the first members, +1 at every resize or
 * shrink that changes it. Rank, size and version change together at those calls only.
 * Automatic op versions count within a cluster version (they restart at 1 after a change,
 * for survivors and joiners alike); explicit versions are the caller's. A process that
 * joins a running job (started by `taiji-run --elastic` with TAIJI_CLUSTER_VERSION) gets
 * its state from the others: a broadcast from rank 0 that every member, joiners included,
 * posts right after each resize (a joiner knows it is one: taiji_peer_joined_version > 1;
 * see docs/elastic.md).
 *
 * Neither call may run concurrently with another call on the same peer (they replace the
 * peer's connections and I/O thread); requests of ops posted before them stay valid. */

/* Resizes the job in place: a collective over the current members, each proposing the same
 * new_size >= 1 (a disagreement is ERR_MISMATCH on every member and nothing changes).
 * Growing: the members keep their ranks and wait (bounded by options.timeout_ms, default
 * the peer's init timeout) for the new processes, ranked old_size..new_size-1, which a
 * launcher starts (`taiji-run --elastic` watches the store for this). Shrinking: ranks
 * >= new_size get *detached = 1 and must finalize (their peer takes no more ops); the
 * others keep their rank. On return rank, size and taiji_peer_cluster_version (+1) are the
 * new ones on every member, and *changed = 1; a new_size equal to the size changes nothing
 * (*changed = 0). Ops posted before the call finish on the old membership (the call waits
 * for them, at most half its deadline) or fail: ERR_PEER_LOST when a member left the old
 * membership without posting it ("rank R has finalized"), else ERR_ABORTED; their requests
 * stay valid. Ops posted after it run on the new membership. A member that does not call it makes the callers fail
 * with ERR_TIMEOUT, keeping the old membership. A failure after the members agreed (a
 * joiner that never comes) leaves the peer failed with that error (taiji_peer_async_error);
 * taiji_shrink, called by every member, then starts the old membership again.
 * Blocks; not from a completion callback or inside a group. changed and detached may be
 * NULL. Errors: ERR_INVALID_ARGUMENT, ERR_MISMATCH, ERR_TIMEOUT, ERR_PEER_LOST,
 * ERR_BOOTSTRAP, ERR_FINALIZED, ERR_NO_MEMORY. */
TAIJI_API taiji_status_t taiji_resize(taiji_peer_t *peer, int new_size,
                                      const taiji_op_options_t *options, int *changed,
                                      int *detached);

/* Continues without lost ranks (after ERR_PEER_LOST): a collective over the surviving
 * members, agreed through the rendezvous store (so the store must outlive the lost ranks:
 * taiji-run's or etcd, not a store rank 0 served if rank 0 is lost). Each survivor waits
 * until every old rank has joined the call or has left (lost on its own links, or
 * finalized: a rank that called taiji_peer_finalize is not waited for); the survivors are
 * then renumbered densely in their old order, the cluster version rises by one, the sticky
 * error is cleared and the peer is usable again (*changed = 1). With no rank lost nothing
 * changes (*changed = 0), unless a failed resize left the peer unusable: then the same
 * members start again at a new cluster version (*changed = 1). In-flight ops of the old membership fail with ERR_ABORTED. A rank
 * lost during the shrink ends it with a clear error (ERR_TIMEOUT or ERR_BOOTSTRAP naming
 * the rank) on every survivor within options.timeout_ms (default: the peer's init timeout);
 * the peer then keeps its error. A second taiji_shrink cannot tell that rank is gone (the
 * old links are closed by then) and waits for it until its deadline: finalize instead. Blocks; not from a
 * completion callback or inside a group. changed may be NULL. Errors:
 * ERR_INVALID_ARGUMENT, ERR_TIMEOUT, ERR_BOOTSTRAP, ERR_NO_MEMORY. */
TAIJI_API taiji_status_t taiji_shrink(taiji_peer_t *peer, const taiji_op_options_t *options,
                                      int *changed);

/* The current cluster version; 0 for NULL. Never blocks. */
TAIJI_API uint64_t taiji_peer_cluster_version(const taiji_peer_t *peer);
/* The cluster version at which this process joined: 1 for the first members, larger for a
 * process a resize started (it must receive the model's state). 0 for NULL. Never blocks. */
TAIJI_API uint64_t taiji_peer_joined_version(const taiji_peer_t *peer);
/* The size an operator or scheduler asked for from outside and no resize has applied yet
 * (`taiji-run --resize N`, or a write of N to the store key "<job id>/elastic/request"),
 * 0 when none is pending or the store does not answer. A resize to that size clears it
 * before any member returns from the resize. Ranks may read it at different moments:
 * agree on it (a broadcast from rank 0) before resizing. Blocks for one store
 * round trip (bounded by one second). -1 for NULL. */
TAIJI_API int taiji_peer_requested_size(taiji_peer_t *peer);

/* ---- names and sizes, for bindings -------------------------------------------------- */

/* Bytes per element; 0 for a value that is not a taiji_dtype_t. Never blocks. */
TAIJI_API size_t taiji_dtype_size(taiji_dtype_t dtype);
/* "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "u32", "i64", "u64"; "unknown" for other
 * values. Static strings. */
TAIJI_API const char *taiji_dtype_name(taiji_dtype_t dtype);
/* "sum", "prod", "min", "max", "avg"; "unknown" for other values. Static strings. */
TAIJI_API const char *taiji_reduce_op_name(taiji_reduce_op_t op);

/* ---- logging ---------------------------------------------------------------------- *
 * The log is the one thing shared by every peer of a process (like TAIJI_LOG_LEVEL). */

typedef enum taiji_log_level {
  TAIJI_LOG_TRACE = 0,
  TAIJI_LOG_DEBUG = 1,
  TAIJI_LOG_INFO = 2,
  TAIJI_LOG_WARN = 3,
  TAIJI_LOG_ERROR = 4,
  TAIJI_LOG_CRITICAL = 5
} taiji_log_level_t;

/* Receives each log line (the text without time or level; valid during the call). It
 * runs on whichever thread logs, the I/O threads included, one call at a time: it must
 * not block for long and must not call taiji functions. */
typedef void (*taiji_log_callback_t)(taiji_log_level_t level, const char *message,
                                     void *user_data);

/* Sends the process's taiji log to `callback` instead of stderr; NULL goes back to
 * stderr. Lines below `level` are dropped before formatting: this level replaces the one
 * TAIJI_LOG_LEVEL set, and peers created later do not change it. When it returns, no call
 * to the previous callback is running or will start. Errors: ERR_INVALID_ARGUMENT (a level
 * out of range). */
TAIJI_API taiji_status_t taiji_set_log_callback(taiji_log_callback_t callback,
                                                taiji_log_level_t level, void *user_data);

/* ---- rendezvous server ------------------------------------------------------------ *
 * The store peers meet at (what taiji-run serves). A launcher or binding that has its own
 * way to tell the job an address (torch's store, a file) starts one, publishes
 * taiji_rendezvous_address, and gives that to every peer as config.rendezvous with
 * host_rendezvous = 0. */

typedef struct taiji_rendezvous taiji_rendezvous_t;

/* Binds host:port and serves on a thread of its own; port 0 lets the system choose (no
 * race: the socket stays bound). Give a host the peers can dial (not 0.0.0.0): the
 * address reported is that host and the bound port. Keep it running until every peer that
 * uses it is finalized or destroyed. On error *server is NULL and
 * taiji_peer_last_error(NULL) on the calling thread says why. Errors: ERR_INVALID_ARGUMENT
 * (NULL, not "host:port"), ERR_IO or ERR_BOOTSTRAP (cannot bind), ERR_NO_MEMORY. */
TAIJI_API taiji_status_t taiji_rendezvous_start(const char *host_port,
                                                taiji_rendezvous_t **server);
/* "host:port" it serves on, the port the one bound. Writes it NUL-terminated, cut to len,
 * and returns its full length (without the NUL); buf may be NULL with len 0. */
TAIJI_API size_t taiji_rendezvous_address(const taiji_rendezvous_t *server, char *buf,
                                          size_t len);
/* Stops serving (clients still connected are closed) and frees it. Accepts NULL. */
TAIJI_API void taiji_rendezvous_stop(taiji_rendezvous_t *server);

#ifdef __cplusplus
}
#endif

/* Monitoring, gradient statistics, the model store, adaptation and links, in their own headers. */
#include "taiji/metrics.h"
#include "taiji/grad_stats.h"
#include "taiji/model_store.h"
#include "taiji/adapt.h"
#include "taiji/links.h"

#endif /* TAIJI_TAIJI_H */
