/* One peer of a fault test, started as its own process by fault_test.py (no launcher: the
 * launcher stops the whole job when one peer dies, which is exactly what these tests do
 * not want). Only the public C API is used.
 *
 * It runs a stream of allreduces (mixed sizes, async with a window of requests and
 * blocking ones, every result checked exactly) until an op fails, then reports on the
 * peer and waits for "go" on stdin before finalize, so that survivors leave only after
 * the driver has read what every one of them saw. Every finished op is one line with
 * CLOCK_MONOTONIC times in ms, the clock the driver reads when it kills or stops a peer:
 *
 *   op i=<step> mode=async|block name=<name> status=<TAIJI_...> post=<ms> end=<ms> text=<...>
 *
 * Options: --timeout-ms N (deadline of every op), --max-count N (elements of the largest
 * op, default 262147: 1 MiB), --only-largest (every op that large), --stop-at STEP (this
 * peer stops itself with SIGSTOP just after posting that step), --later (after the
 * stream, post one async and one blocking op and report them), --abort-after N (this peer
 * calls taiji_peer_abort from a thread of its own once N stream ops succeeded, while two
 * threads wait on one request and one is blocked in a collective no other peer posts). */
#define _POSIX_C_SOURCE 200809L
#include <taiji/taiji.h>

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { WINDOW = 3, STREAM_LIMIT_MS = 120000 };
/* Element counts by step: below and above the eager limit, then a pipelined one of 1 MiB
 * or, with --max-count, larger. */
static size_t counts[] = {1, 1000, 16411, 262147};
static size_t max_count = 262147;

static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;
static taiji_peer_t *peer;
static int rank, size;
static int64_t timeout_ms = 30000;
static atomic_int wrong;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* One line, written whole even when several threads report at once. */
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&out_mu);
  vprintf(fmt, ap);
  putchar('\n');
  fflush(stdout);
  pthread_mutex_unlock(&out_mu);
  va_end(ap);
}

/* The peer's last error on one line (the driver splits lines). */
static const char *last_error_text(void) {
  static _Thread_local char text[512];
  snprintf(text, sizeof text, "%s", taiji_peer_last_error(peer));
  for (char *c = text; *c; ++c) {
    if (*c == '\n') *c = ' ';
  }
  return text[0] ? text : "-";
}

static int32_t element(int r, int step, size_t j) { return (r + 1) * (int32_t)((j + (size_t)step) % 4096); }

static void fill(int32_t *buf, size_t count, int step) {
  for (size_t j = 0; j < count; ++j) buf[j] = element(rank, step, j);
}

static void check(const int32_t *buf, size_t count, int step) {
  const int32_t ranks = size * (size + 1) / 2;
  for (size_t j = 0; j < count; ++j) {
    if (buf[j] != ranks * (int32_t)((j + (size_t)step) % 4096)) {
      say("WRONG i=%d element=%zu value=%d", step, j, (int)buf[j]);
      atomic_store(&wrong, 1);
      return;
    }
  }
}

/* An async op in flight; its callback stamps the completion time. */
typedef struct slot {
  int32_t *buf;
  size_t count;
  int step;
  char name[32];
  double post;
  taiji_request_t *req;
  atomic_int done;
  atomic_llong end_us;
} slot_t;

static void on_done(taiji_status_t status, void *user_data) {
  (void)status;
  slot_t *s = user_data;
  atomic_store(&s->end_us, (long long)(now_ms() * 1000.0));
  atomic_store(&s->done, 1);
}

static taiji_op_options_t options_for(slot_t *s) {
  taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
  opt.timeout_ms = timeout_ms;
  if (s != NULL) {
    opt.callback = on_done;
    opt.user_data = s;
  }
  return opt;
}

/* Waits for a posted slot (its deadline bounds the wait), reports it, frees it. */
static taiji_status_t finish(slot_t *s, const char *label) {
  taiji_status_t st = taiji_request_wait(s->req, timeout_ms + 5000);
  double waited = now_ms();
  for (int spin = 0; spin < 2000 && !atomic_load(&s->done); ++spin) sleep_ms(1);
  double end = atomic_load(&s->done) ? (double)atomic_load(&s->end_us) / 1000.0 : waited;
  say("%s i=%d mode=async name=%s status=%s post=%.3f end=%.3f text=%s", label, s->step, s->name,
      taiji_status_name(st), s->post, end, st == TAIJI_OK ? "-" : taiji_request_error(s->req));
  if (st == TAIJI_OK) check(s->buf, s->count, s->step);
  taiji_request_free(s->req);
  s->req = NULL;
  return st;
}

/* Posts into a slot; a synchronous failure is reported at once. */
static taiji_status_t post_async(slot_t *s, const char *label, const char *name, int step, size_t count) {
  snprintf(s->name, sizeof s->name, "%s", name);
  s->step = step;
  s->count = count;
  fill(s->buf, count, step);
  atomic_store(&s->done, 0);
  taiji_op_options_t opt = options_for(s);
  s->post = now_ms();
  taiji_status_t st = taiji_allreduce(peer, name, s->buf, s->buf, count, TAIJI_I32, TAIJI_SUM, &opt, &s->req);
  if (st != TAIJI_OK) {
    say("%s i=%d mode=async name=%s status=%s post=%.3f end=%.3f text=%s", label, step, name,
        taiji_status_name(st), s->post, now_ms(), last_error_text());
    s->req = NULL;
  }
  return st;
}

static taiji_status_t blocking(const char *label, const char *name, int step, int32_t *buf, size_t count) {
  fill(buf, count, step);
  taiji_op_options_t opt = options_for(NULL);
  double post = now_ms();
  taiji_status_t st = taiji_allreduce(peer, name, buf, buf, count, TAIJI_I32, TAIJI_SUM, &opt, NULL);
  double end = now_ms();
  say("%s i=%d mode=block name=%s status=%s post=%.3f end=%.3f text=%s", label, step, name,
      taiji_status_name(st), post, end, st == TAIJI_OK ? "-" : last_error_text());
  if (st == TAIJI_OK) check(buf, count, step);
  return st;
}

/* ---- the abort scenario: waiters that only the abort can wake ----------------------- */

static atomic_int stream_ok;
static atomic_int holders_blocked;
static taiji_request_t *hold_req;
static int abort_after = -1;
static int stop_at = -1;

static void *wait_on_hold(void *arg) {
  const char *kind = arg;
  atomic_fetch_add(&holders_blocked, 1);
  taiji_status_t st = taiji_request_wait(hold_req, -1);
  say("woke kind=%s status=%s t=%.3f", kind, taiji_status_name(st), now_ms());
  return NULL;
}

static void *block_on_hold(void *arg) {
  (void)arg;
  int32_t v = 1;
  taiji_op_options_t opt = options_for(NULL);
  atomic_fetch_add(&holders_blocked, 1);
  taiji_status_t st = taiji_allreduce(peer, "hold/blocking", &v, &v, 1, TAIJI_I32, TAIJI_SUM, &opt, NULL);
  say("woke kind=blocking status=%s t=%.3f text=%s", taiji_status_name(st), now_ms(), last_error_text());
  return NULL;
}

static void *abort_when_due(void *arg) {
  (void)arg;
  double give_up = now_ms() + STREAM_LIMIT_MS;
  while ((atomic_load(&stream_ok) < abort_after || atomic_load(&holders_blocked) < 3) && now_ms() < give_up) {
    sleep_ms(1);
  }
  /* The counter rises just before each holder enters its call; let them get inside. */
  sleep_ms(200);
  double t = now_ms();
  taiji_status_t st = taiji_peer_abort(peer);
  say("abort status=%s t=%.3f", taiji_status_name(st), t);
  return NULL;
}

/* ---- the SIGSTOP scenario with data in flight --------------------------------------- */

/* Stops this whole process in the middle of an op: after its Ready messages went out, so
 * the other peers are sending it data that it will not read. */
static void stop_in_op(void) {
  sleep_ms(20);
  say("stop t=%.3f", now_ms());
  raise(SIGSTOP);
}

/* ---- main ----------------------------------------------------------------------------- */

static int stream(void) {
  static slot_t slots[WINDOW];
  int32_t *block_buf = malloc(max_count * sizeof(int32_t));
  for (int k = 0; k < WINDOW; ++k) slots[k].buf = malloc(max_count * sizeof(int32_t));
  for (int k = 0; k < WINDOW; ++k) {
    if (slots[k].buf == NULL || block_buf == NULL) return -1;
  }
  double limit = now_ms() + STREAM_LIMIT_MS;
  int step = 0, next = 0;
  taiji_status_t failed = TAIJI_OK;
  char name[32];
  for (; failed == TAIJI_OK && now_ms() < limit; ++step) {
    size_t count = counts[step % 4];
    if (step % 5 == 4) {
      snprintf(name, sizeof name, "sync/%d", step % 2);
      failed = blocking("op", name, step, block_buf, count);
    } else {
      slot_t *s = &slots[next];
      next = (next + 1) % WINDOW;
      if (s->req != NULL && (failed = finish(s, "op")) != TAIJI_OK) break;
      snprintf(name, sizeof name, "grad/%d", step % 3);
      failed = post_async(s, "op", name, step, count);
      if (step == stop_at && failed == TAIJI_OK) stop_in_op();
    }
    if (failed == TAIJI_OK) atomic_fetch_add(&stream_ok, 1);
  }
  /* Whatever is still in flight ends by its deadline; report each in posting order. */
  for (int k = 0; k < WINDOW; ++k) {
    slot_t *s = &slots[(next + k) % WINDOW];
    if (s->req != NULL) finish(s, "op");
  }
  say("stream-end steps=%d failed=%s", step, taiji_status_name(failed));
  for (int k = 0; k < WINDOW; ++k) free(slots[k].buf);
  free(block_buf);
  return 0;
}

static void later_ops(void) {
  static slot_t s;
  static int32_t buf[1000];
  s.buf = buf;
  if (post_async(&s, "later", "later/async", 0, 1000) == TAIJI_OK) finish(&s, "later");
  blocking("later", "later/blocking", 0, buf, 1000);
}

int main(int argc, char **argv) {
  int later = 0, only_largest = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--timeout-ms") == 0 && i + 1 < argc) {
      timeout_ms = atoll(argv[++i]);
    } else if (strcmp(argv[i], "--abort-after") == 0 && i + 1 < argc) {
      abort_after = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--max-count") == 0 && i + 1 < argc) {
      max_count = (size_t)atoll(argv[++i]);
      if (max_count < counts[2]) max_count = counts[2];
    } else if (strcmp(argv[i], "--only-largest") == 0) {
      only_largest = 1;
    } else if (strcmp(argv[i], "--stop-at") == 0 && i + 1 < argc) {
      stop_at = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--later") == 0) {
      later = 1;
    } else {
      fprintf(stderr, "usage: %s [--timeout-ms N] [--max-count N] [--only-largest] [--stop-at STEP] [--later] [--abort-after N]\n", argv[0]);
      return 2;
    }
  }
  for (int k = 0; k < 4; ++k) {
    if (k == 3 || only_largest) counts[k] = max_count;
  }
  taiji_status_t st = taiji_peer_init(NULL, &peer);
  if (st != TAIJI_OK) {
    say("init-failed status=%s text=%s", taiji_status_name(st), taiji_peer_last_error(NULL));
    return 3;
  }
  rank = taiji_peer_rank(peer);
  size = taiji_peer_size(peer);
  say("ready rank=%d size=%d pid=%d", rank, size, (int)getpid());

  pthread_t holders[3], aborter;
  int holding = abort_after >= 0;
  if (holding) {
    /* The async op owns its buffer until it completes, long after this block: static. */
    static int32_t v = 1;
    taiji_op_options_t opt = options_for(NULL);
    if (taiji_allreduce(peer, "hold/async", &v, &v, 1, TAIJI_I32, TAIJI_SUM, &opt, &hold_req) != TAIJI_OK) {
      say("hold-failed text=%s", last_error_text());
      return 4;
    }
    pthread_create(&holders[0], NULL, wait_on_hold, "wait0");
    pthread_create(&holders[1], NULL, wait_on_hold, "wait1");
    pthread_create(&holders[2], NULL, block_on_hold, NULL);
    pthread_create(&aborter, NULL, abort_when_due, NULL);
  }
  if (stream() != 0) {
    say("out-of-memory");
    return 5;
  }
  if (holding) {
    pthread_join(aborter, NULL);
    for (int k = 0; k < 3; ++k) pthread_join(holders[k], NULL);
    taiji_request_free(hold_req);
  }
  if (later) later_ops();
  say("async_error status=%s", taiji_status_name(taiji_peer_async_error(peer)));

  say("held");
  char line[16];
  if (fgets(line, sizeof line, stdin) == NULL) line[0] = '\0';
  double start = now_ms();
  st = taiji_peer_finalize(peer);
  double finalized = now_ms();
  say("finalize status=%s start=%.3f took=%.3f text=%s", taiji_status_name(st), start, finalized - start,
      st == TAIJI_OK ? "-" : last_error_text());
  taiji_peer_destroy(peer);
  say("destroy took=%.3f", now_ms() - finalized);
  say("exit t=%.3f", now_ms());
  return atomic_load(&wrong) ? 1 : 0;
}
