// Peer configuration: explicit values (from the C config struct) win, the environment fills
// what was left unset, defaults fill the rest; then everything is validated. The
// environment contract is documented in docs/environment.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
#include "transport/address.h"

namespace taiji {

// Returns the value of an environment variable, or nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup process_env();

struct Config {
  int rank = -1;                    // -1: unset
  uint32_t cluster_version = 0;     // the membership this process joins; 0: unset (1)
  int size = -1;                    // -1: unset
  std::string rendezvous;           // "host:port"; empty: unset (fine when size == 1)
  int rendezvous_port = 0;          // port next to MASTER_ADDR; 0: unset (MASTER_PORT + 1)
  int host_rendezvous = -1;         // 1: this peer serves the rendezvous; -1: auto (rank 0,
                                    // unless started by taiji-run)
  std::string listen_host;          // address to listen on and advertise; empty: 127.0.0.1
  std::string job_id;               // empty: "taiji"
  int64_t timeout_ms = 0;           // default op deadline; 0: unset (default 60000)
  int64_t init_timeout_ms = 0;      // bootstrap deadline; 0: unset (default 60000)
  uint64_t chunk_bytes = 0;         // pipelining chunk; 0: unset (default 1 MiB)
  uint64_t eager_bytes = 0;         // payloads up to this go without waiting; 0: unset (64 KiB)
  uint64_t unexpected_bytes = 0;    // cap of early-arrival buffer; 0: unset (64 MiB)
  uint64_t max_payload = 0;         // cap of one frame's payload; 0: unset (64 MiB)
  uint32_t max_name_len = 0;        // cap of an op name; 0: unset (256)
  std::string topology;             // built-in name or explicit text; empty: automatic by size
  std::string host_label;           // peers with equal labels share a host; empty: listen_host
  std::string log_level;            // trace, debug, info, warn, error, off; empty: leave it
  std::string secret_file;          // job secret for authenticating connections; empty: none
  std::string secret;               // filled from secret_file by resolve_config
  int64_t handshake_timeout_ms = 0; // a connection's handshake deadline; 0: unset (10000)
  int64_t max_pending_connections = 0;  // connections in their handshake; 0: unset (64)
  int64_t stall_warn_ms = -1;       // warn about ops some peers have not posted; -1: unset
                                    // (10000), 0: off
  int metrics = -1;                 // count and record ops: 1 on, 0 off; -1: unset (on)
  std::string metrics_addr;         // Prometheus endpoint "host:port"; empty: none
  int64_t flight_recorder_size = -1;  // ops the flight recorder keeps; -1: unset (256), 0: off
  std::string flight_recorder_dir;  // where timeout dumps go; empty: unset ($TMPDIR or /tmp)
  std::string progress;             // "adaptive" (spin briefly, then sleep) or "blocking";
                                    // empty: unset (adaptive)
  int64_t spin_us = -1;             // longest spin before sleeping; -1: unset (default), 0: none
  std::string shm;                  // same-host data through shared memory: auto or off;
                                    // empty: unset (auto)
  uint64_t shm_ring_bytes = 0;      // shared-memory ring per directed pair; 0: unset
                                    // (four chunks)
  std::string tcp_congestion;       // TCP congestion control of every link; empty: the system's
  int fusion = -1;                  // fuse small allreduces: 1 on, 0 off; -1: unset (off)
  uint64_t fusion_max_op_bytes = 0; // largest op fused; 0: unset (64 KiB)
  uint64_t fusion_buffer_bytes = 0; // largest fused buffer; 0: unset (4 MiB)
  int64_t model_store_versions = 0; // versions the model store keeps per name; 0: unset (3)
  uint64_t model_store_bytes = 0;   // bound on the model store's bytes; 0: unset (1 GiB)
  std::string nccl;                 // device buffers over NCCL: auto, on or off
  std::string nccl_library;         // the NCCL to load; empty: libnccl.so.2
  // Background link probes, bytes per second (0: none); unset: UINT64_MAX, since 0 is a value.
  uint64_t link_probe_rate = UINT64_MAX;
  uint64_t link_probe_bytes = 0;    // each background probe's payload; 0: unset (256 KiB)
};

// Fills unset fields of `explicit_values` from the environment, then from defaults, and
// validates. The variables, their parsing, bounds and defaults are the table in
// runtime/settings.h; rank, world size and rendezvous also come, in this order, from
//   TAIJI_RANK, TAIJI_WORLD_SIZE, TAIJI_RENDEZVOUS (host:port)
//   RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun style; taiji's rendezvous is on
//     MASTER_PORT + 1 because torchrun's own store holds MASTER_PORT, unless
//     TAIJI_RENDEZVOUS_PORT is set)
//   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE (Open MPI)
//   SLURM_PROCID, SLURM_NTASKS (Slurm).
// A secret file must be a regular file with no group or other permission bits, holding
// 16 bytes to 4 KiB (its bytes, verbatim, are the key).
// Nothing set at all means a single peer: rank 0 of 1. Errors (Code::Config) name the
// variable and the offending value.
Result<Config> resolve_config(Config explicit_values, const EnvLookup& env);

// Reads a job secret file under the rules above; errors (Code::Config) say what is wrong.
Result<std::string> read_secret_file(const std::string& path);

}  // namespace taiji
