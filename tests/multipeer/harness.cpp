#include "harness.h"

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/rendezvous.h"

namespace taiji_test {

std::vector<std::string> run_peers(int n, const std::function<void(taiji_peer_t*, int)>& body,
                                   const PeerOptions& options) {
  static std::atomic<int> job_counter{0};
  std::vector<std::string> failures;
  std::mutex mu;
  auto server = taiji::RendezvousServer::start("127.0.0.1", 0);
  if (!server.is_ok()) return {"rendezvous: " + server.status().message()};
  std::string address = "127.0.0.1:" + std::to_string(server.value()->port());
  std::string job = "test-" + std::to_string(job_counter++);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const std::string& what) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back("rank " + std::to_string(r) + ": " + what);
      };
      taiji_config_t cfg = TAIJI_CONFIG_INIT;
      cfg.rank = r;
      cfg.size = n;
      cfg.rendezvous = address.c_str();
      cfg.host_rendezvous = 0;
      cfg.listen_host = "127.0.0.1";
      cfg.job_id = job.c_str();
      cfg.timeout_ms = options.timeout_ms;
      cfg.init_timeout_ms = 20000;
      cfg.topology = options.topology;
      taiji_peer_t* peer = nullptr;
      taiji_status_t s = taiji_peer_init(&cfg, &peer);
      if (s != TAIJI_OK) {
        fail(std::string("init: ") + taiji_status_name(s) + ": " + taiji_peer_last_error(nullptr));
        return;
      }
      try {
        body(peer, r);
      } catch (const std::exception& e) {
        fail(std::string("body threw: ") + e.what());
      }
      s = taiji_peer_finalize(peer);
      if (s != TAIJI_OK) {
        fail(std::string("finalize: ") + taiji_status_name(s) + ": " + taiji_peer_last_error(peer));
      }
      taiji_peer_destroy(peer);
    });
  }
  for (auto& t : threads) t.join();
  return failures;
}

}  // namespace taiji_test
