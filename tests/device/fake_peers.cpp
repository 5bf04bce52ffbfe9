#include "fake_peers.h"

#include <catch2/catch.hpp>

#include <thread>

#include "device/nccl_runtime.h"

namespace taiji_test {

using namespace taiji;

FakeInstalled::FakeInstalled() { install_device_runtime_for_testing(fake); }
FakeInstalled::~FakeInstalled() { install_device_runtime_for_testing(nullptr); }

void PeerFailures::add(int rank, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  lines_.push_back("rank " + std::to_string(rank) + ": " + what);
}

void PeerFailures::check() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& l : lines_) FAIL_CHECK(l);
}

void run_fake_peers(const std::vector<std::string>& hosts, const std::string& job, const PeerBody& body,
                    PeerFailures& failures, int64_t timeout_ms) {
  const int n = static_cast<int>(hosts.size());
  auto server = RendezvousServer::start("127.0.0.1", 0);
  REQUIRE(server.is_ok());
  const std::string address = "127.0.0.1:" + std::to_string(server.value()->port());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Config c;
      c.rank = r;
      c.size = n;
      c.rendezvous = address;
      c.host_rendezvous = 0;
      c.job_id = job;
      c.timeout_ms = timeout_ms;
      c.init_timeout_ms = 20000;
      if (!hosts[static_cast<size_t>(r)].empty()) c.host_label = hosts[static_cast<size_t>(r)];
      auto config = resolve_config(c, [](const char*) -> const char* { return nullptr; });
      if (!config.is_ok()) return failures.add(r, config.status().message());
      auto peer = Peer::create(config.value());
      if (!peer.is_ok()) return failures.add(r, "create: " + peer.status().message());
      body(r, *peer.value(), failures);
      (void)peer.value()->finalize();
    });
  }
  for (auto& t : threads) t.join();
}

Status wait_request(const std::shared_ptr<RequestState>& req, int64_t ms) {
  Status s;
  if (!req->wait_for(ms, &s)) return {Code::Internal, "still running after " + std::to_string(ms) + " ms"};
  return s;
}

}  // namespace taiji_test
