/* One process of an elastic test, started by `taiji-run --elastic` (or, for a joiner, by
 * the launcher when a resize grows the job). Only the public C API is used. Every line it
 * prints starts with a word the driver (elastic_test.py) reads:
 *
 *   start  rank=R size=S version=V joined=J pid=P
 *   step   rank=R size=S version=V step=N sum=X ok=0|1 at=MS   after each checked allreduce
 *   resize rank=R size=S version=V ms=T                  after each resize (T: from the call
 *                                                        to the first allreduce completed on
 *                                                        the new membership, before the state)
 *   lost   rank=R at=MS text=...                         PEER_LOST seen (CLOCK_REALTIME ms)
 *   shrink rank=R status=NAME size=S version=V at=MS ms=T text=...
 *   detached rank=R version=V
 *   final  rank=R size=S version=V steps=N digest=D     the last membership, at the end
 *
 * Modes:
 *   --sizes A,B,C...   resize through these sizes in turn; before and after each, allreduce
 *                      (i64, exact) and check the sum; after each resize every member, the
 *                      joiners included, receives the state (schedule position, step, a
 *                      model of doubles) by a broadcast from rank 0, and the model's digest
 *                      is checked equal on every rank (allreduce min == max).
 *   --stream           allreduce until PEER_LOST, shrink, then --after N more steps; exits
 *                      1 when the shrink fails (after printing the shrink line). With
 *                      --leave-rank R, rank R finalizes after 10 steps and exits 0.
 *   --propose N        every rank proposes N + rank (ranks disagree unless size is 1) and
 *                      reports what resize returned; then one more allreduce.
 *   --partial          only ranks below size/2 call resize (timeout --timeout-ms); the
 *                      others wait; then everybody allreduces on the old membership.
 *   --inflight         before a resize to size - 1, every rank posts an allreduce they all
 *                      post and rank 0 one that nobody else posts; prints how each ended
 *                      (the first on the old membership, the second with an error) and
 *                      that its request stayed valid, then allreduces on the new membership.
 *   --grow-fails      resize to size + 1 where no process can join (the launcher's --max-np):
 *                      every member's resize fails; then taiji_shrink starts the old
 *                      membership again and an allreduce runs on it.
 *   --timeout-ms N     the deadline of resize and shrink (default 20000). */
#define _POSIX_C_SOURCE 200809L
#include <taiji/taiji.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MODEL = 4096, MAX_SIZES = 64 };

static taiji_peer_t *peer;
static int64_t timeout_ms = 20000;

static double mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(int64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static double wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
  fflush(stdout);
}

static void die(const char *what, taiji_status_t s) {
  say("error rank=%d what=%s status=%s text=%s", taiji_peer_rank(peer), what, taiji_status_name(s),
      taiji_peer_last_error(peer));
  exit(1);
}

/* The state a joiner receives: where the schedule is, the step, the model. */
struct state {
  int64_t position;
  int64_t step;
  double model[MODEL];
};

static uint64_t digest(const struct state *st) {
  uint64_t h = 0xcbf29ce484222325ULL;
  const unsigned char *p = (const unsigned char *)st;
  for (size_t i = 0; i < sizeof(*st); ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

/* One step: every rank adds (rank + 1) * 1000 + step; the sum is known exactly. Returns
 * the status; prints the step line. */
static taiji_status_t step(struct state *st) {
  int rank = taiji_peer_rank(peer), size = taiji_peer_size(peer);
  int64_t v = (int64_t)(rank + 1) * 1000 + st->step, sum = 0;
  taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
  opt.timeout_ms = timeout_ms;
  taiji_status_t s = taiji_allreduce(peer, "elastic.step", &v, &sum, 1, TAIJI_I64, TAIJI_SUM, &opt, NULL);
  if (s != TAIJI_OK) return s;
  int64_t want = (int64_t)size * (size + 1) / 2 * 1000 + (int64_t)size * st->step;
  say("step rank=%d size=%d version=%llu step=%lld sum=%lld ok=%d at=%.0f", rank, size,
      (unsigned long long)taiji_peer_cluster_version(peer), (long long)st->step, (long long)sum,
      sum == want, wall_ms());
  if (sum != want) exit(1);
  st->step++;
  /* The model moves every step, the same way on every rank. */
  for (int i = 0; i < MODEL; ++i) st->model[i] = st->model[i] * 0.5 + (double)(sum % 97) + i * 1e-3;
  return TAIJI_OK;
}

/* Rank 0's state to every member, then a check that all agree bitwise. */
static void sync_state(struct state *st) {
  taiji_status_t s = taiji_broadcast(peer, "elastic.state", st, sizeof(*st), TAIJI_U8, 0, NULL, NULL);
  if (s != TAIJI_OK) die("broadcast state", s);
  uint64_t d = digest(st), lo = 0, hi = 0;
  if ((s = taiji_allreduce(peer, "elastic.digest.min", &d, &lo, 1, TAIJI_U64, TAIJI_MIN, NULL, NULL)) != TAIJI_OK ||
      (s = taiji_allreduce(peer, "elastic.digest.max", &d, &hi, 1, TAIJI_U64, TAIJI_MAX, NULL, NULL)) != TAIJI_OK) {
    die("digest", s);
  }
  if (lo != hi) {
    say("error rank=%d what=state digests differ", taiji_peer_rank(peer));
    exit(1);
  }
}

/* The first op of a new membership, before any state: every rank adds 1. */
static void first_allreduce(void) {
  int64_t one = 1, sum = 0;
  taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
  opt.timeout_ms = timeout_ms;
  taiji_status_t s = taiji_allreduce(peer, "elastic.first", &one, &sum, 1, TAIJI_I64, TAIJI_SUM, &opt, NULL);
  if (s != TAIJI_OK) die("first allreduce", s);
  if (sum != taiji_peer_size(peer)) {
    say("error rank=%d what=first allreduce sum=%lld", taiji_peer_rank(peer), (long long)sum);
    exit(1);
  }
}

static void finish(struct state *st) {
  say("final rank=%d size=%d version=%llu steps=%lld digest=%016llx", taiji_peer_rank(peer),
      taiji_peer_size(peer), (unsigned long long)taiji_peer_cluster_version(peer), (long long)st->step,
      (unsigned long long)digest(st));
  taiji_status_t s = taiji_peer_finalize(peer);
  taiji_peer_destroy(peer);
  exit(s == TAIJI_OK ? 0 : 1);
}

static void run_sizes(int *sizes, int n, struct state *st) {
  if (taiji_peer_joined_version(peer) > 1) {  /* a joiner: where the members are after a resize */
    first_allreduce();
    sync_state(st);
    taiji_status_t s = step(st);
    if (s != TAIJI_OK) die("allreduce after joining", s);
  }
  for (;;) {
    taiji_status_t s;
    if ((s = step(st)) != TAIJI_OK) die("allreduce", s);
    if (st->position >= n) finish(st);
    int target = sizes[st->position++];
    taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
    opt.timeout_ms = timeout_ms;
    int changed = 0, detached = 0;
    double t0 = mono_ms();
    if ((s = taiji_resize(peer, target, &opt, &changed, &detached)) != TAIJI_OK) die("resize", s);
    if (detached) {
      say("detached rank=%d version=%llu", taiji_peer_rank(peer),
          (unsigned long long)taiji_peer_cluster_version(peer));
      s = taiji_peer_finalize(peer);
      taiji_peer_destroy(peer);
      exit(s == TAIJI_OK ? 0 : 1);
    }
    first_allreduce();
    say("resize rank=%d size=%d version=%llu ms=%.1f", taiji_peer_rank(peer), taiji_peer_size(peer),
        (unsigned long long)taiji_peer_cluster_version(peer), mono_ms() - t0);
    sync_state(st);
    if ((s = step(st)) != TAIJI_OK) die("allreduce after resize", s);
  }
}

static void run_inflight(struct state *st) {
  taiji_status_t s;
  if ((s = step(st)) != TAIJI_OK) die("allreduce", s);
  int rank = taiji_peer_rank(peer), size = taiji_peer_size(peer);
  int64_t v = rank + 1, sum = -1, lone = 7, lone_out = -1;
  taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
  opt.timeout_ms = timeout_ms;
  taiji_request_t *shared = NULL, *orphan = NULL;
  if ((s = taiji_allreduce(peer, "elastic.pending", &v, &sum, 1, TAIJI_I64, TAIJI_SUM, &opt, &shared)) != TAIJI_OK) {
    die("post pending", s);
  }
  if (rank == 0 &&
      (s = taiji_allreduce(peer, "elastic.orphan", &lone, &lone_out, 1, TAIJI_I64, TAIJI_SUM, &opt, &orphan)) !=
          TAIJI_OK) {
    die("post orphan", s);
  }
  int changed = 0, detached = 0;
  if ((s = taiji_resize(peer, size - 1, &opt, &changed, &detached)) != TAIJI_OK) die("resize", s);
  taiji_status_t a = taiji_request_wait(shared, 1000);
  say("pending rank=%d status=%s sum=%lld want=%d", rank, taiji_status_name(a), (long long)sum,
      size * (size + 1) / 2);
  taiji_request_free(shared);
  if (orphan) {
    taiji_status_t b = taiji_request_wait(orphan, 1000);
    say("orphan rank=%d status=%s text=%s", rank, taiji_status_name(b), taiji_request_error(orphan));
    taiji_request_free(orphan);
  }
  if (detached) {
    s = taiji_peer_finalize(peer);
    taiji_peer_destroy(peer);
    exit(s == TAIJI_OK ? 0 : 1);
  }
  first_allreduce();
  finish(st);
}

static void run_grow_fails(struct state *st) {
  taiji_status_t s;
  if ((s = step(st)) != TAIJI_OK) die("allreduce", s);
  int rank = taiji_peer_rank(peer), size = taiji_peer_size(peer), changed = -1, detached = -1;
  taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
  opt.timeout_ms = timeout_ms;
  double t0 = mono_ms();
  s = taiji_resize(peer, size + 1, &opt, &changed, &detached);
  say("grow rank=%d status=%s async=%s ms=%.0f text=%s", rank, taiji_status_name(s),
      taiji_status_name(taiji_peer_async_error(peer)), mono_ms() - t0, s == TAIJI_OK ? "" : taiji_peer_last_error(peer));
  if (s == TAIJI_OK) exit(1);
  s = taiji_shrink(peer, &opt, &changed);
  say("shrink rank=%d status=%s changed=%d size=%d version=%llu at=%.0f ms=%.1f text=%s", rank,
      taiji_status_name(s), changed, taiji_peer_size(peer), (unsigned long long)taiji_peer_cluster_version(peer),
      wall_ms(), mono_ms() - t0, s == TAIJI_OK ? "" : taiji_peer_last_error(peer));
  if (s != TAIJI_OK) exit(1);
  first_allreduce();
  sync_state(st);
  if ((s = step(st)) != TAIJI_OK) die("allreduce after the rebuild", s);
  finish(st);
}

static void run_stream(int after, int leave_rank, struct state *st) {
  int done_after = 0, shrunk = 0;
  for (;;) {
    if (!shrunk && taiji_peer_rank(peer) == leave_rank && st->step == 10) {
      say("leaving rank=%d", leave_rank);
      taiji_status_t s = taiji_peer_finalize(peer);
      taiji_peer_destroy(peer);
      exit(s == TAIJI_OK ? 0 : 1);
    }
    taiji_status_t s = step(st);
    if (s == TAIJI_OK) {
      if (shrunk && ++done_after >= after) finish(st);
      if (!shrunk) sleep_ms(2);
      continue;
    }
    if (s != TAIJI_ERR_PEER_LOST) die("allreduce", s);
    double lost_at = wall_ms(), t0 = mono_ms();
    say("lost rank=%d at=%.0f text=%s", taiji_peer_rank(peer), lost_at, taiji_peer_last_error(peer));
    taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
    opt.timeout_ms = timeout_ms;
    int changed = 0, old_rank = taiji_peer_rank(peer);
    s = taiji_shrink(peer, &opt, &changed);
    say("shrink rank=%d status=%s size=%d version=%llu at=%.0f ms=%.1f text=%s", old_rank,
        taiji_status_name(s), taiji_peer_size(peer), (unsigned long long)taiji_peer_cluster_version(peer),
        wall_ms(), mono_ms() - t0, s == TAIJI_OK ? "" : taiji_peer_last_error(peer));
    if (s != TAIJI_OK) exit(1);
    shrunk = 1;
    /* Steps count on: every survivor saw the same last good step? Not necessarily (the
     * loss hit them at different steps), so the survivors agree on rank 0's. */
    sync_state(st);
  }
}

int main(int argc, char **argv) {
  int sizes[MAX_SIZES], n = 0, stream = 0, after = 20, propose = -1, partial = 0, inflight = 0, grow_fails = 0,
      leave_rank = -1;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
      for (char *tok = strtok(argv[++i], ","); tok && n < MAX_SIZES; tok = strtok(NULL, ",")) sizes[n++] = atoi(tok);
    } else if (!strcmp(argv[i], "--stream")) {
      stream = 1;
    } else if (!strcmp(argv[i], "--after") && i + 1 < argc) {
      after = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--propose") && i + 1 < argc) {
      propose = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--leave-rank") && i + 1 < argc) {
      leave_rank = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--grow-fails")) {
      grow_fails = 1;
    } else if (!strcmp(argv[i], "--inflight")) {
      inflight = 1;
    } else if (!strcmp(argv[i], "--partial")) {
      partial = 1;
    } else if (!strcmp(argv[i], "--timeout-ms") && i + 1 < argc) {
      timeout_ms = atoll(argv[++i]);
    } else {
      fprintf(stderr, "elastic_peer: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  taiji_status_t s = taiji_peer_init(NULL, &peer);
  if (s != TAIJI_OK) {
    fprintf(stderr, "init: %s\n", taiji_peer_last_error(NULL));
    return 1;
  }
  say("start rank=%d size=%d version=%llu joined=%llu pid=%ld", taiji_peer_rank(peer), taiji_peer_size(peer),
      (unsigned long long)taiji_peer_cluster_version(peer), (unsigned long long)taiji_peer_joined_version(peer),
      (long)getpid());
  static struct state st;
  for (int i = 0; i < MODEL; ++i) st.model[i] = i;
  if (stream) run_stream(after, leave_rank, &st);
  if (inflight) run_inflight(&st);
  if (grow_fails) run_grow_fails(&st);
  if (propose >= 0 || partial) {
    if ((s = step(&st)) != TAIJI_OK) die("allreduce", s);
    int rank = taiji_peer_rank(peer), size = taiji_peer_size(peer), changed = -1, detached = -1;
    taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
    opt.timeout_ms = timeout_ms;
    uint64_t before = taiji_peer_cluster_version(peer);
    double t0 = mono_ms();
    if (partial && rank >= size / 2) {
      sleep_ms(timeout_ms + 500);  /* never calls resize */
      s = TAIJI_OK;
    } else {
      s = taiji_resize(peer, propose >= 0 ? propose + rank : size + 1, &opt, &changed, &detached);
    }
    say("proposed rank=%d status=%s changed=%d detached=%d size=%d version=%llu before=%llu ms=%.0f text=%s",
        rank, taiji_status_name(s), changed, detached, taiji_peer_size(peer),
        (unsigned long long)taiji_peer_cluster_version(peer), (unsigned long long)before, mono_ms() - t0,
        s == TAIJI_OK ? "" : taiji_peer_last_error(peer));
    if ((s = step(&st)) != TAIJI_OK) die("allreduce after the refused resize", s);
    finish(&st);
  }
  run_sizes(sizes, n, &st);
  return 0;
}
