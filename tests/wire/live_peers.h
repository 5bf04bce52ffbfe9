// Real peers in this process, for the wire tests to attack: a rendezvous server the test
// owns (port 0, so concurrent runs never collide), configurations resolved without the
// process environment, a two-rank job started from two threads, an exact allreduce check,
// and the resident-memory probe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/peer.h"
#include "bootstrap/rendezvous.h"

namespace wire {

// What the runtime puts in every frame's cluster_version (src/runtime/peer.cpp).
constexpr uint32_t kClusterVersion = 1;

struct Rendezvous {
  std::unique_ptr<taiji::RendezvousServer> server;
  std::string address;
};
// Starts a rendezvous server on 127.0.0.1 and a free port; *error says why not.
Rendezvous start_rendezvous(std::string* error);

// The explicit fields of one rank of a two-rank job on loopback; tests adjust it, then
// resolve() fills the rest from defaults (never from this process's environment).
taiji::Config base_config(int rank, const std::string& rendezvous, const std::string& job);
taiji::Result<taiji::Config> resolve(const taiji::Config& explicit_values);

// A two-rank job of real peers.
struct LivePair {
  std::unique_ptr<taiji::Peer> peer[2];
  std::string rank0_address;  // where rank 0 listens, as published at the rendezvous
};
// Creates ranks 0 and 1 concurrently from their (resolved) configurations.
std::string start_pair(const taiji::Config& rank0, const taiji::Config& rank1, LivePair* out);

// The value a rank published under "<job>/addr/<rank>": its address, without the host label.
std::string published_address(const std::string& rendezvous, const std::string& job, int rank,
                              std::string* error);

// An allreduce (SUM of `count` i32, inputs derived from `round`) on both peers; empty when
// both completed with the exact sums, else what went wrong.
std::string check_allreduce(taiji::Peer& a, taiji::Peer& b, const std::string& name,
                            uint64_t round, uint64_t count = 64);

// Resident set size in bytes, read after malloc_trim(0) so memory freed back to glibc's
// arenas but not yet returned to the system does not count as growth. Under
// AddressSanitizer: the heap bytes still allocated (its quarantine inflates the RSS).
size_t resident_bytes();
constexpr size_t kMiB = 1 << 20;

}  // namespace wire
