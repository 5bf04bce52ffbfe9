/* taiji-nccl-vs-taiji: taiji_allreduce on device memory (TAIJI_MEMORY_DEVICE) against
 * ncclAllReduce called directly on the same buffers and stream, with nccl-tests' definitions
 * of time, algbw and busbw: the median time of small ops (latency) and the bus bandwidth of
 * large ones, every result checked bitwise against a sum made on the host.
 *
 * Every process of the job runs it under `taiji-run -np N`; rank 0 prints the tables. The
 * CUDA runtime and NCCL are opened with dlopen, as libtaiji does, so it runs against the
 * libraries a Python environment installed (scripts/gpu-check.sh puts them on the loader's
 * path). Exits 77 where no GPU is usable, 1 on a wrong result, 3 when taiji's device path
 * refused the ops (the NCCL columns are still measured), 2 on other errors. */
#define _POSIX_C_SOURCE 200809L

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <taiji/taiji.h>

#define CUDA_FUNCTIONS(X)                                                                 \
  X(cudaGetDeviceCount) X(cudaGetErrorString) X(cudaSetDevice) X(cudaMalloc) X(cudaFree) \
  X(cudaMemcpy) X(cudaMemset) X(cudaStreamCreateWithFlags) X(cudaStreamSynchronize)      \
  X(cudaStreamDestroy) X(cudaRuntimeGetVersion) X(cudaDriverGetVersion)
#define NCCL_FUNCTIONS(X)                                                           \
  X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclAllReduce)         \
  X(ncclCommFinalize) X(ncclCommDestroy) X(ncclGetErrorString)

/* The headers' own declarations give the pointers' types. */
#define DECLARE(name) static __typeof__(&name) p_##name;
CUDA_FUNCTIONS(DECLARE)
NCCL_FUNCTIONS(DECLARE)
#undef DECLARE

typedef struct {
  int lat_iters, bw_iters, warmup;
  size_t max_lat_bytes, min_bw_bytes, max_bw_bytes;
} options_t;

typedef struct {
  taiji_peer_t *peer;
  int rank, world;
  ncclComm_t comm;
  cudaStream_t stream;
  float *send, *recv;     /* device, max_bw_bytes each */
  float *expected, *got;  /* host */
  double *samples;
} bench_t;

static int g_rank = -1;

static void die(const char *what, const char *why) {
  fprintf(stderr, "taiji-nccl-vs-taiji[%d]: %s: %s\n", g_rank, what, why);
  exit(2);
}

static void cuda_check(cudaError_t err, const char *call) {
  if (err != cudaSuccess) die(call, p_cudaGetErrorString(err));
}

static void nccl_check(ncclResult_t r, const char *call) {
  if (r != ncclSuccess) die(call, p_ncclGetErrorString(r));
}

static void taiji_check(bench_t *b, taiji_status_t s, const char *call) {
  if (s != TAIJI_OK) die(call, taiji_peer_last_error(b->peer));
}

/* $var if set, else each of `names` in turn. Returns NULL with dlerror()'s text in `why`. */
static void *open_library(const char *var, const char *const *names, char *why, size_t len) {
  const char *path = getenv(var);
  const char *const chosen[] = {path, NULL};
  if (path != NULL && *path != '\0') names = chosen;
  why[0] = '\0';
  for (; *names != NULL; ++names) {
    void *handle = dlopen(*names, RTLD_NOW | RTLD_LOCAL);
    if (handle != NULL) return handle;
    const char *e = dlerror();
    size_t used = strlen(why);
    snprintf(why + used, len - used, "%s%s", used ? "; " : "", e ? e : *names);
  }
  return NULL;
}

static int resolve(void *handle, const char *name, void **out, char *why, size_t len) {
  *out = dlsym(handle, name);
  if (*out == NULL) snprintf(why, len, "%s: no such symbol", name);
  return *out != NULL;
}

/* Function pointers come back from dlsym as void *; POSIX guarantees the conversion. */
#define RESOLVE(name)                                                               \
  if (!resolve(lib, #name, &sym, why, len)) return 0;                               \
  memcpy(&p_##name, &sym, sizeof sym);

static int load_cuda(char *why, size_t len) {
  static const char *const names[] = {"libcudart.so.13", "libcudart.so", NULL};
  void *lib = open_library("TAIJI_BENCH_CUDART", names, why, len);
  void *sym = NULL;
  if (lib == NULL) return 0;
  CUDA_FUNCTIONS(RESOLVE)
  return 1;
}

static int load_nccl(char *why, size_t len) {
  static const char *const names[] = {"libnccl.so.2", NULL};
  void *lib = open_library("TAIJI_BENCH_NCCL", names, why, len);
  void *sym = NULL;
  if (lib == NULL) return 0;
  NCCL_FUNCTIONS(RESOLVE)
  return 1;
}
#undef RESOLVE

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Small integers, so that any summation order gives the same float sum: the check is
 * bitwise. */
static float pattern(size_t i, int rank) {
  return (float)((int)((i * 7 + (size_t)rank * 13) % 257) - 128);
}

static size_t parse_bytes(const char *s) {
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end == 'K') v <<= 10;
  if (*end == 'M') v <<= 20;
  if (*end == 'G') v <<= 30;
  return (size_t)v;
}

static void usage(void) {
  fprintf(stderr,
          "usage: taiji-run -np N taiji-nccl-vs-taiji [--quick] [--lat-iters N] [--bw-iters N]\n"
          "                                          [--max-bytes B[K|M|G]]\n"
          "  latency: 4 B .. 64 KiB, median of --lat-iters ops (default 50)\n"
          "  bandwidth: 16 MiB .. --max-bytes (default 256M), median of --bw-iters (default 5)\n"
          "  --quick: 10 latency iterations, bandwidth up to 32 MiB with 3 iterations\n");
}

static void parse_options(int argc, char **argv, options_t *o) {
  *o = (options_t){50, 5, 3, 64 << 10, 16 << 20, (size_t)256 << 20};
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--quick") == 0) {
      o->lat_iters = 10;
      o->bw_iters = 3;
      o->warmup = 2;
      o->max_bw_bytes = 32 << 20;
    } else if (strcmp(a, "--lat-iters") == 0 && next) {
      o->lat_iters = atoi(argv[++i]);
    } else if (strcmp(a, "--bw-iters") == 0 && next) {
      o->bw_iters = atoi(argv[++i]);
    } else if (strcmp(a, "--max-bytes") == 0 && next) {
      o->max_bw_bytes = parse_bytes(argv[++i]);
    } else {
      usage();
      exit(strcmp(a, "--help") == 0 ? 0 : 2);
    }
  }
  if (o->lat_iters < 1 || o->bw_iters < 1 || o->max_bw_bytes < o->max_lat_bytes) {
    usage();
    exit(2);
  }
}

/* The median of `iters` timed ops (after o->warmup untimed), each timed to the end of the
 * device work; whether the last one's result is right; taiji's status when it refused. */
typedef struct {
  double median_s;
  int ok;
  taiji_status_t status;
} measured_t;

static measured_t measure(bench_t *b, const options_t *o, int use_taiji, size_t bytes,
                          int iters) {
  measured_t m = {0, 0, TAIJI_OK};
  size_t count = bytes / sizeof(float);
  char name[64];
  snprintf(name, sizeof name, "nvt.%zu", bytes);
  taiji_op_options_t opts = TAIJI_OP_OPTIONS_INIT;
  opts.memory = TAIJI_MEMORY_DEVICE;
  opts.stream = b->stream;
  opts.timeout_ms = 30000; /* a rank refused at post leaves the others waiting this long */
  /* Poison the output, so that a result left from an earlier row cannot pass the check. */
  cuda_check(p_cudaMemset(b->recv, 0xff, bytes), "cudaMemset");
  for (int i = 0; i < o->warmup + iters; ++i) {
    double t0 = now_s();
    if (use_taiji) {
      m.status = taiji_allreduce(b->peer, name, b->send, b->recv, count, TAIJI_F32, TAIJI_SUM,
                                 &opts, NULL);
      if (m.status != TAIJI_OK) return m;
    } else {
      nccl_check(p_ncclAllReduce(b->send, b->recv, count, ncclFloat32, ncclSum, b->comm,
                                 b->stream),
                 "ncclAllReduce");
    }
    cuda_check(p_cudaStreamSynchronize(b->stream), "cudaStreamSynchronize");
    if (i >= o->warmup) b->samples[i - o->warmup] = now_s() - t0;
  }
  m.median_s = median(b->samples, iters);
  cuda_check(p_cudaMemcpy(b->got, b->recv, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  m.ok = memcmp(b->got, b->expected, bytes) == 0;
  return m;
}

/* Every rank's view made one: the slowest rank's medians, and each flag as the minimum
 * over the ranks (1 only where it held on every rank). */
static void agree(bench_t *b, double medians[2], int flags[3]) {
  taiji_check(b, taiji_allreduce(b->peer, "nvt.medians", medians, medians, 2, TAIJI_F64,
                                 TAIJI_MAX, NULL, NULL),
              "taiji_allreduce (medians)");
  taiji_check(b, taiji_allreduce(b->peer, "nvt.flags", flags, flags, 3, TAIJI_I32, TAIJI_MIN,
                                 NULL, NULL),
              "taiji_allreduce (flags)");
}

static void print_size(size_t bytes) {
  if (bytes >= (1u << 20)) printf("%8zuM", bytes >> 20);
  else if (bytes >= (1u << 10)) printf("%8zuK", bytes >> 10);
  else printf("%8zuB", bytes);
}

/* One row per size. Returns 1 when every result was right. */
static int run_table(bench_t *b, const options_t *o, size_t from, size_t to, int iters,
                     int bandwidth, int *taiji_ok) {
  int all_ok = 1;
  const double bus = b->world > 1 ? 2.0 * (b->world - 1) / b->world : 1.0;
  if (b->rank == 0) {
    if (bandwidth)
      printf("\n# bus bandwidth (GB/s; algbw when N = 1), median of %d\n"
             "#     size   nccl_us  nccl_bus  taiji_us taiji_bus  speed  check\n", iters);
    else
      printf("\n# latency, median of %d (speed = nccl time / taiji time)\n"
             "#     size   nccl_us  taiji_us  speed  check\n", iters);
  }
  for (size_t bytes = from; bytes <= to; bytes *= 2) {
    measured_t n = measure(b, o, 0, bytes, iters);
    measured_t t = {0, 0, TAIJI_OK};
    if (*taiji_ok) t = measure(b, o, 1, bytes, iters);
    double medians[2] = {n.median_s, t.median_s};
    int flags[3] = {n.ok, t.status == TAIJI_OK, t.ok};
    agree(b, medians, flags);
    if (*taiji_ok && !flags[1]) {
      /* Each rank that was refused says why (taiji-run prefixes its rank); from here on
       * only NCCL is measured. */
      if (t.status != TAIJI_OK)
        printf("# taiji's device allreduce failed: %s: %s\n", taiji_status_name(t.status),
               taiji_peer_last_error(b->peer));
      *taiji_ok = 0;
    }
    int row_ok = flags[0] && (!*taiji_ok || flags[2]);
    all_ok = all_ok && row_ok;
    if (b->rank != 0) continue;
    print_size(bytes);
    double nus = medians[0] * 1e6, tus = medians[1] * 1e6;
    if (bandwidth) {
      double nbw = (double)bytes / medians[0] * bus / 1e9;
      if (*taiji_ok)
        printf("  %8.1f  %8.2f  %8.1f  %8.2f  %5.2f", nus, nbw, tus,
               (double)bytes / medians[1] * bus / 1e9, medians[0] / medians[1]);
      else
        printf("  %8.1f  %8.2f  %8s  %8s  %5s", nus, nbw, "-", "-", "-");
    } else if (*taiji_ok) {
      printf("  %8.1f  %8.1f  %5.2f", nus, tus, medians[0] / medians[1]);
    } else {
      printf("  %8.1f  %8s  %5s", nus, "-", "-");
    }
    printf("  %s\n", row_ok ? "ok" : "FAIL");
    fflush(stdout);
  }
  return all_ok;
}

int main(int argc, char **argv) {
  options_t o;
  parse_options(argc, argv, &o);
  char why[2048];
  int devices = 0;
  if (!load_cuda(why, sizeof why)) {
    fprintf(stderr, "taiji-nccl-vs-taiji: no GPU: the CUDA runtime did not load: %s\n", why);
    return 77;
  }
  cudaError_t err = p_cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices < 1) {
    fprintf(stderr, "taiji-nccl-vs-taiji: no GPU: cudaGetDeviceCount: %s\n",
            err != cudaSuccess ? p_cudaGetErrorString(err) : "no device");
    return 77;
  }
  if (!load_nccl(why, sizeof why)) die("NCCL did not load", why);

  bench_t b;
  memset(&b, 0, sizeof b);
  taiji_status_t s = taiji_peer_init(NULL, &b.peer);
  if (s != TAIJI_OK) die("taiji_peer_init", taiji_peer_last_error(NULL));
  b.rank = g_rank = taiji_peer_rank(b.peer);
  b.world = taiji_peer_size(b.peer);
  const char *local = getenv("TAIJI_LOCAL_RANK");
  int device = (local ? atoi(local) : b.rank) % devices;
  cuda_check(p_cudaSetDevice(device), "cudaSetDevice");
  cuda_check(p_cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags");

  /* NCCL's own communicator: rank 0's id reaches the others over taiji, on host memory. */
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (b.rank == 0) nccl_check(p_ncclGetUniqueId(&id), "ncclGetUniqueId");
  taiji_op_options_t host = TAIJI_OP_OPTIONS_INIT;
  host.memory = TAIJI_MEMORY_HOST;
  taiji_check(&b, taiji_broadcast(b.peer, "nvt.id", &id, sizeof id, TAIJI_U8, 0, &host, NULL),
              "taiji_broadcast (NCCL id)");
  nccl_check(p_ncclCommInitRank(&b.comm, b.world, id, b.rank), "ncclCommInitRank");

  size_t max_bytes = o.max_bw_bytes, n = max_bytes / sizeof(float);
  int max_iters = o.lat_iters > o.bw_iters ? o.lat_iters : o.bw_iters;
  cuda_check(p_cudaMalloc((void **)&b.send, max_bytes), "cudaMalloc");
  cuda_check(p_cudaMalloc((void **)&b.recv, max_bytes), "cudaMalloc");
  b.expected = malloc(max_bytes);
  b.got = malloc(max_bytes);
  b.samples = malloc(sizeof(double) * (size_t)max_iters);
  if (!b.expected || !b.got || !b.samples) die("malloc", "out of memory");
  /* Each size uses a prefix of these: the pattern does not depend on the size. */
  for (size_t i = 0; i < n; ++i) b.got[i] = pattern(i, b.rank);
  for (size_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int r = 0; r < b.world; ++r) sum += pattern(i, r);
    b.expected[i] = sum;
  }
  cuda_check(p_cudaMemcpy(b.send, b.got, max_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");

  if (b.rank == 0) {
    int cuda_rt = 0, driver = 0, nccl = 0;
    p_cudaRuntimeGetVersion(&cuda_rt);
    p_cudaDriverGetVersion(&driver);
    p_ncclGetVersion(&nccl);
    printf("# taiji-nccl-vs-taiji: %d rank(s), device %d of %d; taiji %s, NCCL %d.%d.%d, "
           "CUDA runtime %d.%d, driver %d.%d; allreduce f32 sum, out of place\n",
           b.world, device, devices, taiji_version_string(), nccl / 10000, nccl % 10000 / 100,
           nccl % 100, cuda_rt / 1000, cuda_rt % 1000 / 10, driver / 1000, driver % 1000 / 10);
  }
  int taiji_ok = 1;
  int ok = run_table(&b, &o, 4, o.max_lat_bytes, o.lat_iters, 0, &taiji_ok);
  ok = run_table(&b, &o, o.min_bw_bytes, o.max_bw_bytes, o.bw_iters, 1, &taiji_ok) && ok;

  nccl_check(p_ncclCommFinalize(b.comm), "ncclCommFinalize");
  nccl_check(p_ncclCommDestroy(b.comm), "ncclCommDestroy");
  cuda_check(p_cudaFree(b.send), "cudaFree");
  cuda_check(p_cudaFree(b.recv), "cudaFree");
  cuda_check(p_cudaStreamDestroy(b.stream), "cudaStreamDestroy");
  free(b.expected);
  free(b.got);
  free(b.samples);
  s = taiji_peer_finalize(b.peer);
  taiji_peer_destroy(b.peer);
  if (s != TAIJI_OK) die("taiji_peer_finalize", taiji_status_name(s));
  if (b.rank == 0) printf("# %s\n", !ok ? "FAIL" : taiji_ok ? "ok" : "taiji device path refused");
  return !ok ? 1 : taiji_ok ? 0 : 3;
}
