/* A pure C11 program using only the public header, run as separate processes under
 * taiji-run: a setting by name, async allreduce with a callback, broadcast, barrier,
 * request lifecycle. */
#define _POSIX_C_SOURCE 200809L /* nanosleep under -std=c11 */

#include <taiji/taiji.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static atomic_int callbacks;

static void on_done(taiji_status_t status, void *user_data) {
  if (status == TAIJI_OK && user_data == (void *)&callbacks) atomic_fetch_add(&callbacks, 1);
}

static int check(taiji_peer_t *peer, taiji_status_t s, const char *what) {
  if (s == TAIJI_OK) return 0;
  fprintf(stderr, "%s: %s: %s\n", what, taiji_status_name(s), taiji_peer_last_error(peer));
  return 1;
}

int main(void) {
  taiji_peer_t *peer = NULL;
  /* Any variable can also be set by its name; this one is checked below. */
  taiji_config_t config = TAIJI_CONFIG_INIT;
  taiji_status_t s = taiji_config_set(&config, "TAIJI_MAX_NAME_LEN", "64");
  if (s == TAIJI_OK) s = taiji_peer_init(&config, &peer);
  taiji_config_clear(&config);
  if (s != TAIJI_OK) {
    fprintf(stderr, "init: %s: %s\n", taiji_status_name(s), taiji_peer_last_error(NULL));
    return 1;
  }
  int rank = taiji_peer_rank(peer), size = taiji_peer_size(peer), bad = 0;
  enum { N = 4099 };
  static double in[N], out[N];
  static int32_t bcast[N];
  for (int i = 0; i < N; ++i) in[i] = rank + i;

  taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
  opt.callback = on_done;
  opt.user_data = (void *)&callbacks;
  opt.timeout_ms = 30000;
  taiji_request_t *req = NULL;
  bad |= check(peer, taiji_allreduce(peer, "grad/w", in, out, N, TAIJI_F64, TAIJI_SUM, &opt, &req),
               "allreduce post");
  if (req != NULL) {
    bad |= check(peer, taiji_request_wait(req, 30000), "allreduce wait");
    if (taiji_request_version(req) != 1) bad |= 1;
    taiji_request_free(req);
  }
  double ranks_sum = size * (size - 1) / 2.0;
  for (int i = 0; i < N; ++i) {
    if (out[i] != ranks_sum + (double)size * i) {
      fprintf(stderr, "allreduce: element %d is %f\n", i, out[i]);
      bad = 1;
      break;
    }
  }
  for (int i = 0; i < N; ++i) bcast[i] = rank == size - 1 ? i * 7 : -1;
  bad |= check(peer, taiji_broadcast(peer, "params", bcast, N, TAIJI_I32, size - 1, NULL, NULL),
               "broadcast");
  for (int i = 0; i < N; ++i) {
    if (bcast[i] != i * 7) {
      fprintf(stderr, "broadcast: element %d is %d\n", i, (int)bcast[i]);
      bad = 1;
      break;
    }
  }
  bad |= check(peer, taiji_barrier(peer, "end", NULL, NULL), "barrier");
  static const char name_of_65[] =
      "0123456789012345678901234567890123456789012345678901234567890123X";
  if (taiji_barrier(peer, name_of_65, NULL, NULL) != TAIJI_ERR_INVALID_ARGUMENT) {
    fprintf(stderr, "a 65-byte name passed TAIJI_MAX_NAME_LEN=64\n");
    bad = 1;
  }
  /* Callbacks run on the I/O thread and may lag the wait above: give this rank's up to
   * 20 s, locally (the count differs between ranks, so no collective may wait for it). */
  const struct timespec step = {0, 1000000};
  for (int ms = 0; ms < 20000 && atomic_load(&callbacks) < 1; ++ms) nanosleep(&step, NULL);
  if (atomic_load(&callbacks) != 1) {
    fprintf(stderr, "callback ran %d times\n", atomic_load(&callbacks));
    bad = 1;
  }
  bad |= check(peer, taiji_peer_finalize(peer), "finalize");
  taiji_peer_destroy(peer);
  if (!bad) printf("rank %d of %d ok\n", rank, size);
  return bad;
}
