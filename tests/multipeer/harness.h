// Runs N peers as threads of this process over loopback: a rendezvous store on a free
// port, one thread per rank, each with its own taiji_peer_t. Every wait is bounded.
#pragma once

#include <taiji/taiji.h>

#include <functional>
#include <string>
#include <vector>

namespace taiji_test {

struct PeerOptions {
  int64_t timeout_ms = 20000;
  int64_t init_timeout_ms = 20000;
  const char* topology = nullptr;
  // Adjusts one rank's configuration just before its init (per-peer deadlines, topology).
  std::function<void(int rank, taiji_config_t& config)> configure;
  // Whether a rank's finalize status is acceptable. Unset: only TAIJI_OK is. Tests that
  // leave an op behind on purpose, or abort a peer, expect specific errors here.
  std::function<bool(int rank, taiji_status_t status)> finalize_ok;
  // false: destroy the peers without finalizing them (tests of destroy's own shutdown).
  bool finalize = true;
};

// Starts n peers, runs body(peer, rank) on each peer's thread, finalizes and destroys
// them. Returns one line per failure (init, body, finalize); empty when all went well.
std::vector<std::string> run_peers(int n, const std::function<void(taiji_peer_t*, int)>& body,
                                   const PeerOptions& options = {});

}  // namespace taiji_test
