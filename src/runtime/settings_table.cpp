// Every setting taiji reads: docs/environment.md shows the same names, defaults and
// meanings, and tests/unit/test_config_doc.cpp fails when the two differ. Entries whose
// default depends on another setting come after it: resolve_config fills them in order.
#include <algorithm>
#include <array>
#include <limits>

#include "bootstrap/etcd_store.h"
#include "bootstrap/rendezvous.h"
#include "monitor/http_server.h"
#include "runtime/settings.h"
#include "transport/address.h"

namespace taiji {

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kNoMax = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kIntMax = static_cast<uint64_t>(std::numeric_limits<int>::max());
constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// libuv takes each buffer's length as 32 bits; a larger payload would be cut on the wire.
constexpr uint64_t kMaxPayloadLimit = 4 * kMiB * kKiB - 1;
// Below this the per-frame header and syscall overhead dominate the transfer.
constexpr uint64_t kMinChunkBytes = 4 * kKiB;
constexpr uint64_t kMaxLinkProbeRate = uint64_t{1} << 30;
constexpr uint64_t kMinLinkProbeBytes = kKiB;
constexpr uint64_t kMaxLinkProbeBytes = uint64_t{16} << 20;
// The frame header carries name_len in 16 bits.
constexpr uint64_t kMaxNameLenCap = 65535;
constexpr size_t kMaxJobIdBytes = kRendezvousMaxKey - 32;  // room for "/addr/" and a rank
constexpr size_t kMaxHostLabelBytes = 4096;
constexpr uint64_t kMaxPending = 65536;  // more than any host's file descriptors allow
constexpr uint64_t kMaxFlightRecorderSize = 1 << 20;
constexpr uint64_t kMaxSpinUs = 1000000;
// A model store keeping more versions than this is a leak, not a setting.
constexpr uint64_t kMaxModelVersions = 1024;
// Rings hold this many chunks by default: enough that a sender seldom waits for room (each
// wait costs a credit frame and a wake-up), few enough that the ring stays in cache. In
// alternating runs at n=2 and 4, 1-64 MiB, 4 MiB rings were never far from the best of
// 2, 4 and 8 MiB; 8 MiB was 1.1-1.6x slower from 16 MiB, 2 MiB up to 1.6x slower at 4 MiB
// on a loaded host.
constexpr uint64_t kShmRingChunks = 4;
constexpr uint64_t kMinShmRingBytes = 64 * kKiB;
constexpr uint64_t kMaxShmRingBytes = 16 * kMiB * kKiB;

constexpr std::array<SettingWord, 2> kDigitWords = {{{"0", 0}, {"1", 1}}};
constexpr std::array<SettingWord, 4> kOnOffWords = {{{"on", 1}, {"off", 0}, {"1", 1}, {"0", 0}}};
constexpr std::array<SettingWord, 2> kProgressModes = {{{"adaptive"}, {"blocking"}}};
constexpr std::array<SettingWord, 2> kShmModes = {{{"auto"}, {"off"}}};
constexpr std::array<SettingWord, 2> kNoneWords = {{{"off", 0}, {"0", 0}}};
constexpr std::array<SettingWord, 3> kNcclModes = {{{"auto"}, {"on"}, {"off"}}};
constexpr std::array<SettingWord, 7> kLogLevels = {
    {{"trace"}, {"debug"}, {"info"}, {"warn"}, {"error"}, {"critical"}, {"off"}}};

std::string check_rendezvous(const std::string& value) {
  if (EtcdStore::is_etcd_address(value)) return EtcdStore::check_address(value);
  std::string host;
  uint16_t port = 0;
  std::string why = split_host_port(value, false, &host, &port);
  return why.empty() ? "" : "is not host:port: " + why;
}

std::string check_metrics_address(const std::string& value) {
  std::string host;
  uint16_t port = 0;
  std::string why = parse_metrics_address(value, &host, &port);
  return why.empty() ? "" : "is not [host:]port: " + why;
}

// Each peer publishes "<address>\n<host label>" under "<job id>/addr/<rank>" in the
// rendezvous store, whose keys and values are bounded.
std::string check_job_id(const std::string& value) {
  if (value.size() <= kMaxJobIdBytes) return "";
  return "is longer than " + std::to_string(kMaxJobIdBytes) +
         " bytes (the rendezvous key holds it)";
}

// A host label, or a library path: text that a rendezvous record or a log line carries.
std::string check_host_label(const std::string& value) {
  if (value.size() <= kMaxHostLabelBytes) return "";
  return "is longer than " + std::to_string(kMaxHostLabelBytes) + " bytes";
}

// The kernel's names (TCP_CA_NAME_MAX); whether this host has it is checked at init.
std::string check_congestion(const std::string& value) {
  const bool ok = value.size() < 16 && std::all_of(value.begin(), value.end(), [](char ch) {
                    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_';
                  });
  return ok ? "" : "is not a name like cubic or bbr (lower-case letters, digits, '_'; at most 15)";
}

// etcd serves its own store.
std::string rank_zero_hosts(const Config& c, const EnvLookup&) {
  return c.rank == 0 && !EtcdStore::is_etcd_address(c.rendezvous) ? "1" : "0";
}

std::string listen_host_label(const Config& c, const EnvLookup&) { return c.listen_host; }

std::string four_chunks(const Config& c, const EnvLookup&) {
  return std::to_string(c.chunk_bytes > kMaxShmRingBytes / kShmRingChunks
                            ? kMaxShmRingBytes
                            : std::max(kMinShmRingBytes, kShmRingChunks * c.chunk_bytes));
}

std::string temp_dir(const Config&, const EnvLookup& env) {
  const char* tmp = env("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

using T = SettingType;

const Setting kSettings[] = {
    {.name = "TAIJI_RANK", .field = "rank", .type = T::Integer, .member = &Config::rank,
     .unset = -1, .min = 0, .max = kIntMax, .def_doc = "`0` in a job of one",
     .doc = "This peer's rank, 0..2147483647 and below the world size; read as a pair with "
            "`TAIJI_WORLD_SIZE`.", .resolved_apart = true},
    {.name = "TAIJI_WORLD_SIZE", .field = "size", .type = T::Integer, .member = &Config::size,
     .unset = -1, .min = 1, .max = kIntMax, .def = "1",
     .doc = "The number of peers in the job, 1..2147483647; read as a pair with `TAIJI_RANK`.",
     .resolved_apart = true},
    {.name = "TAIJI_CLUSTER_VERSION", .field = "cluster_version", .type = T::Integer,
     .member = &Config::cluster_version, .unset = 0, .min = 1, .max = UINT32_MAX, .def = "1",
     .doc = "The cluster version this process joins at: `1` for a job's first members; "
            "`taiji-run --elastic` sets it for the processes a resize starts (docs/elastic.md)."},
    {.name = "TAIJI_RENDEZVOUS", .field = "rendezvous", .type = T::String,
     .member = &Config::rendezvous, .check = check_rendezvous,
     .def_doc = "from `MASTER_ADDR`, else none",
     .doc = "`host:port` (or `[ipv6]:port`) of the rendezvous store, or `etcd://HOST:PORT/PREFIX` "
            "for an etcd v3 store (keys under `PREFIX/`).",
     .resolved_apart = true},
    {.name = "TAIJI_RENDEZVOUS_PORT", .field = "rendezvous_port", .type = T::Integer,
     .member = &Config::rendezvous_port, .unset = 0, .min = 1, .max = 65535,
     .def_doc = "`MASTER_PORT` + 1",
     .doc = "Port of the rendezvous store at `MASTER_ADDR`, 1..65535.", .resolved_apart = true},
    {.name = "TAIJI_RENDEZVOUS_HOST", .field = "host_rendezvous", .type = T::Switch,
     .member = &Config::host_rendezvous, .unset = -1, .words = kDigitWords, .what = "auto",
     .computed_default = rank_zero_hosts, .def_doc = "`1` on rank 0, else `0`",
     .doc = "`1`: this peer serves the rendezvous store; `0`: it does not."},
    {.name = "TAIJI_LISTEN_HOST", .field = "listen_host", .type = T::String,
     .member = &Config::listen_host, .def = "127.0.0.1",
     .doc = "Address this peer listens on and advertises to the others. Set it to a routable "
            "address for multi-host jobs."},
    {.name = "TAIJI_JOB_ID", .field = "job_id", .type = T::String, .member = &Config::job_id,
     .what = "job id", .check = check_job_id, .def = "taiji",
     .doc = "Peers of one job must agree; a connection from another job is refused. At most "
            "`max_name_len` bytes, and at most 992 (it is part of the rendezvous keys)."},
    {.name = "TAIJI_TIMEOUT_MS", .field = "timeout_ms", .type = T::Millis,
     .member = &Config::timeout_ms, .max = kInt64Max, .def = "60000",
     .doc = "Default deadline of an operation, in milliseconds. Positive integer; more than a "
            "year (31536000000) counts as a year."},
    {.name = "TAIJI_INIT_TIMEOUT_MS", .field = "init_timeout_ms", .type = T::Millis,
     .member = &Config::init_timeout_ms, .max = kInt64Max, .def = "60000",
     .doc = "Deadline for joining the job (rendezvous and connections). Positive integer; more "
            "than a year counts as a year."},
    {.name = "TAIJI_CHUNK_BYTES", .field = "chunk_bytes", .type = T::Bytes,
     .member = &Config::chunk_bytes, .min = kMinChunkBytes, .max = kNoMax,
     .what = "chunk size", .def = "1M",
     .doc = "Pipelining chunk size. At least `4K`, at most the max payload."},
    {.name = "TAIJI_EAGER_BYTES", .field = "eager_bytes", .type = T::Bytes,
     .member = &Config::eager_bytes, .max = kNoMax, .what = "eager size", .def = "64K",
     .doc = "Messages up to this size are sent without waiting for the receiver to post. At most "
            "the max payload."},
    {.name = "TAIJI_UNEXPECTED_BYTES", .field = "unexpected_bytes", .type = T::Bytes,
     .member = &Config::unexpected_bytes, .max = kNoMax, .what = "unexpected-data cap",
     .def = "64M",
     .doc = "Cap of the buffer that holds data arriving before the matching op is posted."},
    {.name = "TAIJI_MAX_PAYLOAD_BYTES", .field = "max_payload", .type = T::Bytes,
     .member = &Config::max_payload, .max = kMaxPayloadLimit, .what = "max payload",
     .bound_why = "4 GiB - 1, the largest socket buffer libuv takes", .def = "64M",
     .doc = "Largest payload of one frame; a peer announcing more is a protocol error. At most "
            "`4294967295` (4 GiB − 1, the largest buffer libuv writes in one piece)."},
    {.name = "TAIJI_MAX_NAME_LEN", .field = "max_name_len", .type = T::Integer,
     .member = &Config::max_name_len, .unset = 0, .min = 1, .max = kMaxNameLenCap,
     .bound_why = "the frame header holds it in 16 bits", .def = "256",
     .doc = "Longest op name (and job id) accepted, 32..65535 (the frame holds it in 16 bits; "
            "the library's own ops need names of up to 18 bytes, a statistics-carrying allreduce "
            "9 more than its own). Plain integer, no suffix."},
    {.name = "TAIJI_TOPOLOGY", .field = "topology", .type = T::String,
     .member = &Config::topology, .def_doc = "automatic",
     .doc = "A built-in strategy (`star`, `ring`, `clique`, `tree`, `binary_tree`, "
            "`binary_tree_star`, `multi_binary_tree_star`, `hierarchical`) or the explicit text "
            "form (see `src/topology/text.h`); unset picks `clique` (a direct exchange) up to 1 "
            "KiB on two peers, `tree` up to 64 KiB and `ring` above."},
    {.name = "TAIJI_HOST", .field = "host_label", .type = T::String,
     .member = &Config::host_label, .what = "host label", .check = check_host_label,
     .computed_default = listen_host_label, .def_doc = "the listen host",
     .doc = "Host label: peers with the same label count as one host for the host-aware "
            "strategies (`tree`, `binary_tree_star`, `multi_binary_tree_star`, `hierarchical`). "
            "At most 4096 bytes."},
    {.name = "TAIJI_SHM", .field = "shm", .type = T::Enum, .member = &Config::shm,
     .words = kShmModes, .what = "shared-memory mode", .def = "auto",
     .doc = "`auto`: peers on the same host (same `TAIJI_HOST` label or listen host) move "
            "payloads of 4 KiB and more through a shared-memory ring, and smaller frames through "
            "a shared-memory mailbox beside it, instead of the TCP link; `off`: TCP only. A ring "
            "that cannot be mapped (another container, no memory) is declined and TCP carries "
            "that pair's data."},
    {.name = "TAIJI_SHM_RING_BYTES", .field = "shm_ring_bytes", .type = T::Bytes,
     .member = &Config::shm_ring_bytes, .min = kMinShmRingBytes, .max = kMaxShmRingBytes,
     .what = "shared-memory ring size", .computed_default = four_chunks,
     .def_doc = "four times `TAIJI_CHUNK_BYTES` (`4M`)",
     .doc = "Size of each shared-memory ring, one per ordered pair of same-host peers (a host of "
            "*k* peers holds *k(k−1)* of them, reserved up front, each with a 64 KiB mailbox for "
            "small frames). `64K` to `16G`. When the ring is full, payloads wait for room; a "
            "payload larger than the ring goes over TCP. Each payload sent to an empty ring "
            "starts at the ring's first byte; a larger ring lets senders run further ahead, but "
            "through memory that is no longer in cache (8 MiB measured 1.1–1.6× slower than 4 "
            "MiB from 16 MiB); a smaller one makes them wait for room more often."},
    {.name = "TAIJI_TCP_CONGESTION", .field = "tcp_congestion", .type = T::String,
     .member = &Config::tcp_congestion, .what = "TCP congestion control",
     .check = check_congestion, .def_doc = "the system's",
     .doc = "TCP congestion control for every link (`TCP_CONGESTION`), e.g. `cubic`, `reno`, "
            "`bbr`, `dctcp`. It must be in `/proc/sys/net/ipv4/tcp_available_congestion_control` "
            "(and, for an unprivileged process, in `tcp_allowed_congestion_control`), else "
            "`taiji_peer_init` fails with `TAIJI_ERR_CONFIG` naming the file (in a job of more "
            "than one peer: a peer alone opens no links and checks nothing). On the emulated "
            "cluster's shaped 1 Gbit/s links with jumbo frames, `cubic` kept the queue full "
            "where the host's `bbr` left gaps: allreduce 16 MiB 0.955 vs 0.935 of the link rate "
            "(see docs/performance.md)."},
    {.name = "TAIJI_LOG_LEVEL", .field = "log_level", .type = T::Enum,
     .member = &Config::log_level, .words = kLogLevels, .what = "log level",
     .def_doc = "`warn`, or as left",
     .doc = "`trace`, `debug`, `info`, `warn`, `error`, `critical` or `off` (lower case). The "
            "level is the process's, shared by all its peers: a peer that sets it sets it for "
            "them all, unless `taiji_set_log_callback` chose one (that stays); unset, a peer "
            "leaves it as it is."},
    {.name = "TAIJI_SECRET_FILE", .field = "secret_file", .type = T::String,
     .member = &Config::secret_file, .def_doc = "none",
     .doc = "Job secret: every connection is authenticated with it (HMAC-SHA256 "
            "challenge–response, see docs/security.md). The file must be a regular file "
            "with no group or other permission bits (`chmod 600`) and hold 16 bytes to 4 KiB, "
            "used verbatim. `taiji-run --secret` makes one per job."},
    {.name = "TAIJI_HANDSHAKE_TIMEOUT_MS", .field = "handshake_timeout_ms", .type = T::Millis,
     .member = &Config::handshake_timeout_ms, .max = kInt64Max, .def = "10000",
     .doc = "A connection that has not finished its handshake (Hello, and with a secret the "
            "proof of it) in this time is closed."},
    {.name = "TAIJI_MAX_PENDING_CONNECTIONS", .field = "max_pending_connections",
     .type = T::Integer, .member = &Config::max_pending_connections, .unset = 0, .min = 1,
     .max = kMaxPending, .def = "64",
     .doc = "Accepted connections allowed in their handshake at once (1–65536); more are closed "
            "on arrival."},
    {.name = "TAIJI_STALL_WARN_MS", .field = "stall_warn_ms", .type = T::Integer,
     .member = &Config::stall_warn_ms, .unset = -1, .min = 0, .max = kInt64Max,
     .def = "10000",
     .doc = "An op still running this long after it was posted asks every rank whether it has "
            "posted it and logs (warning) its name and the ranks that have not. `0` turns the "
            "watchdog off."},
    {.name = "TAIJI_METRICS", .field = "metrics", .type = T::Switch, .member = &Config::metrics,
     .unset = -1, .words = kDigitWords, .what = "unset", .def = "1",
     .doc = "`1`: every op is counted, timed and kept in the flight recorder (see "
            "`include/taiji/metrics.h`); `0`: not (link byte counters and step marks still "
            "work). `taiji_metrics_set_enabled` switches it at run time."},
    {.name = "TAIJI_METRICS_ADDR", .field = "metrics_addr", .type = T::String,
     .member = &Config::metrics_addr, .what = "metrics address",
     .check = check_metrics_address, .def_doc = "none",
     .doc = "Serve the metrics in the Prometheus text format at `http://ADDR/metrics`. `port`, "
            "`:port`, `host:port` or `[ipv6]:port`; the host defaults to `127.0.0.1` (loopback "
            "only; use `0.0.0.0:port` to let a remote Prometheus scrape). Peers on one host take "
            "`port`, `port+1`, ... in rank order; port `0` takes a free port, logged at info "
            "level and returned by `taiji_metrics_address`. A port that cannot be bound fails "
            "`taiji_peer_init` with `TAIJI_ERR_IO`."},
    {.name = "TAIJI_FLIGHT_RECORDER_SIZE", .field = "flight_recorder_size", .type = T::Integer,
     .member = &Config::flight_recorder_size, .unset = -1, .min = 0,
     .max = kMaxFlightRecorderSize, .def = "256",
     .doc = "Ops the flight recorder keeps (the last ones started), 0..1048576; `0` turns it off."},
    {.name = "TAIJI_FLIGHT_RECORDER_DIR", .field = "flight_recorder_dir", .type = T::String,
     .member = &Config::flight_recorder_dir, .computed_default = temp_dir,
     .def_doc = "`$TMPDIR` or `/tmp`",
     .doc = "Where the flight recorder is written when ops time out (at most once a second), as "
            "`taiji-flight-JOB-rankR-pidP-N.json`; the warning that reports the timeout's dump "
            "names the file."},
    {.name = "TAIJI_PROGRESS", .field = "progress", .type = T::Enum, .member = &Config::progress,
     .words = kProgressModes, .what = "progress mode", .def = "adaptive",
     .doc = "How the I/O thread and waiting callers wait. `adaptive`: after traffic the I/O "
            "thread polls its sockets and inbox for a short window before it sleeps in epoll "
            "(with peers on other hosts not while an op above `TAIJI_EAGER_BYTES` is in flight "
            "or after a bulk read; when every rank is on this host, through large ops too), and "
            "a caller waiting on a request asks for the loop: the polling I/O thread lends it "
            "and parks, and the caller runs it on its own thread until its op completes (user "
            "callbacks still run on the I/O thread), else spins briefly, then sleeps on a "
            "condition variable; windows halve when polling finds nothing, so an idle peer "
            "sleeps. `blocking`: always sleep (lowest CPU use, higher small-message latency)."},
    // Long enough to cover a small op's round trip on loopback or a fast LAN, short enough
    // that an idle peer gives its core back within a fraction of a millisecond.
    {.name = "TAIJI_SPIN_US", .field = "spin_us", .type = T::Integer, .member = &Config::spin_us,
     .unset = -1, .min = 0, .max = kMaxSpinUs, .def = "200",
     .doc = "The longest polling or spinning window, in microseconds, 0..1000000; `0` is the "
            "same as `blocking`. Longer windows catch slower replies but cost more CPU after "
            "each burst of traffic. A quarter of it is also how long the I/O thread first parks "
            "after lending the loop to a waiting caller (then up to 1 ms, or that quarter if "
            "longer): the most an op posted with no caller waiting waits for the loop."},
    {.name = "TAIJI_FUSION", .field = "fusion", .type = T::Switch, .member = &Config::fusion,
     .unset = -1, .words = kOnOffWords, .what = "unset", .def = "off",
     .doc = "`on` (or `1`): small allreduces are fused (see docs/fusion.md); `off` (or "
            "`0`): every op runs alone. Every peer of a job must use the same setting."},
    {.name = "TAIJI_FUSION_MAX_OP_BYTES", .field = "fusion_max_op_bytes", .type = T::Bytes,
     .member = &Config::fusion_max_op_bytes, .max = kNoMax, .what = "fusion op size",
     .def = "64K",
     .doc = "Largest allreduce (count × element size) that fusion takes; larger ones run alone. "
            "At most `TAIJI_FUSION_BUFFER_BYTES`. Same on every peer."},
    {.name = "TAIJI_FUSION_BUFFER_BYTES", .field = "fusion_buffer_bytes", .type = T::Bytes,
     .member = &Config::fusion_buffer_bytes, .max = kNoMax, .what = "fusion buffer",
     .def = "4M",
     .doc = "Largest fused buffer: ops of one dtype and reduction are packed into buffers up to "
            "this size, each reduced by one allreduce. Same on every peer."},
    {.name = "TAIJI_MODEL_STORE_VERSIONS", .field = "model_store_versions", .type = T::Integer,
     .member = &Config::model_store_versions, .unset = 0, .min = 1, .max = kMaxModelVersions,
     .def = "3",
     .doc = "Versions of each name the model store keeps (`taiji_model_save`, see "
            "docs/model-store.md), 1..1024; a save past it evicts the oldest."},
    {.name = "TAIJI_MODEL_STORE_BYTES", .field = "model_store_bytes", .type = T::Bytes,
     .member = &Config::model_store_bytes, .max = kNoMax, .what = "model store bound",
     .def = "1G",
     .doc = "Bound on the bytes the model store keeps, all versions of all names together; a "
            "save that would pass it fails with `TAIJI_ERR_NO_MEMORY` and keeps what was kept. "
            "Every saved version is a copy held until it is evicted."},
    {.name = "TAIJI_NCCL", .field = "nccl", .type = T::Enum, .member = &Config::nccl,
     .words = kNcclModes, .what = "NCCL mode", .def = "auto",
     .doc = "Device buffers (docs/gpu.md): `auto` loads the CUDA runtime at the first op, and "
            "NCCL only when a GPU is visible; ops on device memory run over NCCL, and fail with "
            "`TAIJI_ERR_NO_DEVICE` where no GPU or NCCL is usable. `on`: the peer fails to start "
            "(`TAIJI_ERR_CONFIG`, naming why) unless both load and a GPU is visible. `off`: never "
            "loaded; device ops fail with `TAIJI_ERR_NO_DEVICE`."},
    {.name = "TAIJI_NCCL_LIBRARY", .field = "nccl_library", .type = T::String,
     .member = &Config::nccl_library, .what = "NCCL library", .check = check_host_label,
     .def_doc = "`libnccl.so.2`",
     .doc = "The NCCL library to load (a path, or a name the dynamic loader finds), so that a "
            "GPU machine can use its own NCCL. At most 4096 bytes."},
    {.name = "TAIJI_LINK_PROBE_RATE", .field = "link_probe_rate", .type = T::Bytes,
     .member = &Config::link_probe_rate, .unset = -1, .max = kMaxLinkProbeRate, .words = kNoneWords,
     .what = "link probe rate", .def = "off",
     .doc = "Background link probing, in bytes per second that the probes may send in all "
            "(`off` or `0`: none). The I/O thread probes one link at a time, in turn; the samples go "
            "into the metrics and `taiji_measure_links` with `background` gathers them. At "
            "most `1G`."},
    {.name = "TAIJI_LINK_PROBE_BYTES", .field = "link_probe_bytes", .type = T::Bytes,
     .member = &Config::link_probe_bytes, .min = kMinLinkProbeBytes, .max = kMaxLinkProbeBytes,
     .what = "link probe size", .def = "256K",
     .doc = "Payload of each background link probe: `1K` to `16M` (within the max payload). "
            "Larger probes measure fast links better and probe each link less often."},
};

}  // namespace

std::span<const Setting> settings() { return kSettings; }

}  // namespace taiji
