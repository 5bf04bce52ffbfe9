#include "harness.h"

#include <signal.h>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "bootstrap/rendezvous.h"

namespace taiji_test {

namespace {

std::atomic<int> sigpipes{0};

void count_sigpipe(int) { sigpipes.fetch_add(1); }

// Under the default disposition a SIGPIPE kills the whole test binary and every result of
// its run with it. Counting it instead turns it into a failure of the run that raised it:
// a library must not signal its host process when a peer's connection goes away.
void catch_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa = {};
    sa.sa_handler = count_sigpipe;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, nullptr);
  });
}

}  // namespace

std::vector<std::string> run_peers(int n, const std::function<void(taiji_peer_t*, int)>& body,
                                   const PeerOptions& options) {
  static std::atomic<int> job_counter{0};
  catch_sigpipe();
  const int sigpipes_before = sigpipes.load();
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
      cfg.init_timeout_ms = options.init_timeout_ms;
      cfg.topology = options.topology;
      if (options.configure) options.configure(r, cfg);
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
      } catch (...) {
        fail("body threw a non-standard exception");
      }
      if (options.finalize) {
        s = taiji_peer_finalize(peer);
        bool accepted = options.finalize_ok ? options.finalize_ok(r, s) : s == TAIJI_OK;
        if (!accepted) {
          fail(std::string("finalize: ") + taiji_status_name(s) + ": " + taiji_peer_last_error(peer));
        }
      }
      taiji_peer_destroy(peer);
    });
  }
  for (auto& t : threads) t.join();
  if (int raised = sigpipes.load() - sigpipes_before; raised > 0) {
    failures.push_back("the process received SIGPIPE " + std::to_string(raised) +
                       " time(s) while the peers ran (a write to a closed connection); with the "
                       "default disposition that kills the process");
  }
  return failures;
}

}  // namespace taiji_test
