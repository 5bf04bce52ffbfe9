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
  const char* topology = nullptr;
};

// Starts n peers, runs body(peer, rank) on each peer's thread, finalizes and destroys
// them. Returns one line per failure (init, body, finalize); empty when all went well.
std::vector<std::string> run_peers(int n, const std::function<void(taiji_peer_t*, int)>& body,
                                   const PeerOptions& options = {});

}  // namespace taiji_test
