#include "live_peers.h"

#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
// From the AddressSanitizer runtime (sanitizer/allocator_interface.h, which gcc does not ship).
extern "C" size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace wire {

Rendezvous start_rendezvous(std::string* error) {
  Rendezvous r;
  auto server = taiji::RendezvousServer::start("127.0.0.1", 0);
  if (!server.is_ok()) {
    *error = "rendezvous: " + server.status().message();
    return r;
  }
  r.server = std::move(server.value());
  r.address = "127.0.0.1:" + std::to_string(r.server->port());
  return r;
}

taiji::Config base_config(int rank, const std::string& rendezvous, const std::string& job) {
  taiji::Config c;
  c.rank = rank;
  c.size = 2;
  c.rendezvous = rendezvous;
  c.host_rendezvous = 0;
  c.listen_host = "127.0.0.1";
  c.job_id = job;
  c.timeout_ms = 20000;
  c.init_timeout_ms = 20000;
  c.topology = "star";
  // log_level stays unset: the process's level is the test's (LogCapture lowers it).
  c.stall_warn_ms = 0;
  return c;
}

taiji::Result<taiji::Config> resolve(const taiji::Config& explicit_values) {
  return taiji::resolve_config(explicit_values, [](const char*) -> const char* { return nullptr; });
}

std::string start_pair(const taiji::Config& rank0, const taiji::Config& rank1, LivePair* out) {
  auto create = [](taiji::Config c) { return taiji::Peer::create(c); };
  auto f0 = std::async(std::launch::async, create, rank0);
  auto f1 = std::async(std::launch::async, create, rank1);
  auto r0 = f0.get();
  auto r1 = f1.get();
  if (!r0.is_ok()) return "rank 0: " + r0.status().message();
  if (!r1.is_ok()) return "rank 1: " + r1.status().message();
  out->peer[0] = std::move(r0.value());
  out->peer[1] = std::move(r1.value());
  std::string error;
  out->rank0_address = published_address(rank0.rendezvous, rank0.job_id, 0, &error);
  return error;
}

std::string published_address(const std::string& rendezvous, const std::string& job, int rank,
                              std::string* error) {
  auto client = taiji::RendezvousClient::connect(rendezvous, 10000);
  if (!client.is_ok()) {
    *error = "rendezvous: " + client.status().message();
    return {};
  }
  auto value = client.value()->get(job + "/addr/" + std::to_string(rank), 10000);
  if (!value.is_ok()) {
    *error = "rendezvous: " + value.status().message();
    return {};
  }
  return value.value().substr(0, value.value().find('\n'));
}

std::string check_allreduce(taiji::Peer& a, taiji::Peer& b, const std::string& name,
                            uint64_t round, uint64_t count) {
  taiji::Peer* peers[2] = {&a, &b};
  std::vector<int32_t> in[2];
  std::vector<int32_t> out[2];
  std::shared_ptr<taiji::RequestState> req[2];
  for (int p = 0; p < 2; ++p) {
    in[p].resize(count);
    out[p].assign(count, -1);
    for (uint64_t i = 0; i < count; ++i) {
      in[p][i] = static_cast<int32_t>((round * 131 + i * 7 + 1) * static_cast<uint64_t>(p + 1));
    }
    taiji::PostArgs args;
    args.name = name;
    args.send = in[p].data();
    args.recv = out[p].data();
    args.count = count;
    args.dtype = taiji::DType::I32;
    args.redop = taiji::RedOp::Sum;
    auto posted = peers[p]->post(std::move(args));
    if (!posted.is_ok()) return "post on rank " + std::to_string(p) + ": " + posted.status().message();
    req[p] = posted.value();
  }
  for (int p = 0; p < 2; ++p) {
    taiji::Status s;
    if (!req[p]->wait_for(20000, &s)) return "allreduce on rank " + std::to_string(p) + " did not complete in 20 s";
    if (!s.is_ok()) return "allreduce on rank " + std::to_string(p) + ": " + s.message();
    for (uint64_t i = 0; i < count; ++i) {
      int32_t want = in[0][i] + in[1][i];
      if (out[p][i] != want) {
        return "allreduce on rank " + std::to_string(p) + ": element " + std::to_string(i) + " is " +
               std::to_string(out[p][i]) + ", want " + std::to_string(want);
      }
    }
  }
  return {};
}

size_t resident_bytes() {
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer keeps freed memory in quarantine, so the resident size only grows;
  // the bytes the program still holds are the measure of growth there.
  return __sanitizer_get_current_allocated_bytes();
#endif
  malloc_trim(0);
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0;
  unsigned long resident = 0;
  int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  if (got != 2) return 0;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace wire
