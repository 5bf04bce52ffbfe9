/* taiji model store: one-sided fetches of another rank's saved model.
 * Included by <taiji/taiji.h>.
 *
 * Every peer keeps a store of named, versioned byte buffers. A rank saves its model into
 * its own peer (taiji_model_save); any rank fetches it (taiji_model_request) without the
 * owner's caller taking part: the owner's I/O thread answers while its training thread
 * computes, sleeps or does anything else. Asynchronous pair averaging (AD-PSGD) is the
 * use it was made for: each step averages with a random peer's latest model.
 *
 * The store keeps the last TAIJI_MODEL_STORE_VERSIONS versions of each name (default 3;
 * an older one is evicted by the save past it) and at most TAIJI_MODEL_STORE_BYTES bytes
 * of all versions of all names together (default 1G). A saved version is a copy: the
 * caller's buffer is free again when taiji_model_save returns. A version evicted while a
 * reply is sending it stays alive until that reply is sent. The store belongs to the
 * peer of one membership: taiji_resize and taiji_shrink start a new, empty one.
 * See docs/model-store.md. */
#ifndef TAIJI_MODEL_STORE_H
#define TAIJI_MODEL_STORE_H

#include "taiji/taiji.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copies `bytes` bytes from buf into this peer's store under `name` as `version`: 0 saves
 * the latest kept version + 1 (1 for a new name); an explicit version must be above the
 * latest kept one. Keeps the last TAIJI_MODEL_STORE_VERSIONS versions of the name,
 * evicting the oldest. *saved (may be NULL) gets the version saved. Never blocks on the
 * network (it copies the buffer and takes a short lock); any thread, also a completion
 * callback. buf is only read, and only during the call; it may be NULL when bytes is 0.
 * Errors: ERR_INVALID_ARGUMENT (NULL peer or name, an empty name, a name starting with
 * "taiji." or longer than TAIJI_MAX_NAME_LEN, NULL buf with bytes > 0),
 * ERR_STALE_VERSION (an explicit version not above the latest kept), ERR_NO_MEMORY (the
 * save would pass TAIJI_MODEL_STORE_BYTES: the message names the bound, the bytes held
 * and the bytes asked; nothing kept is lost), ERR_FINALIZED (after finalize or abort). */
TAIJI_API taiji_status_t taiji_model_save(taiji_peer_t *peer, const char *name, const void *buf,
                                          size_t bytes, uint64_t version, uint64_t *saved);

/* Fetches `name` at `version` (0: the latest kept) from rank's store into buf, which
 * holds `bytes` bytes: exactly the saved size. Served by that rank's I/O thread; a
 * request to this peer's own rank is copied on the calling thread. With request == NULL
 * it blocks until the model is in buf or the request failed (not from a completion
 * callback). Otherwise it returns at once with *request set, like a collective: buf must
 * stay valid and untouched until the request completes (test/wait, or the callback).
 * options (may be NULL): timeout_ms (0: the peer's op timeout), callback and user_data,
 * as for collectives; version, topology and grad_stats are ignored. Any thread. buf holds
 * partial data after an error.
 * Errors: ERR_INVALID_ARGUMENT (NULL peer or name, a reserved or empty name, rank out of
 * range, NULL buf with bytes > 0, a negative timeout, blocking from a callback or inside
 * an open group), ERR_NOT_FOUND (no such name, or the version was never saved or was
 * evicted), ERR_MISMATCH (bytes differs from the stored size: the message names both),
 * ERR_TIMEOUT (no full reply by the deadline), ERR_PEER_LOST (rank was lost or
 * finalized, reported as soon as its link goes down), ERR_ABORTED or ERR_FINALIZED (this
 * peer aborted or finalized with the request in flight, or before it), ERR_NO_MEMORY
 * (the owner holds too many of this rank's requests). If the call fails, the callback is
 * never called. */
TAIJI_API taiji_status_t taiji_model_request(taiji_peer_t *peer, int rank, const char *name,
                                             uint64_t version, void *buf, size_t bytes,
                                             const taiji_op_options_t *options,
                                             taiji_request_t **request);

#ifdef __cplusplus
}
#endif

#endif /* TAIJI_MODEL_STORE_H */
