// Splitting a peer's job into child jobs (taiji_peer_split), with no rendezvous from
// outside: the parent's own links carry what the children need to meet.
//
//  1. An allgather of (color, key) under "taiji.split" (automatic version v): every rank
//     learns every rank's choice and computes its child rank, by (key, parent rank), and
//     its child's size.
//  2. Each child's rank 0 starts a rendezvous server on a port the system picks, on the
//     host this peer listens on; an allgather of fixed-size address records under
//     "taiji.split.addr" (explicit version v, so that one failed split cannot put this
//     name's counter out of step between ranks) tells the other members where it is.
//  3. Each member creates the child: a Peer of its own (I/O thread, connections) over
//     that server, with the parent's configuration. The child's rank 0 keeps the server
//     until the child goes.
// The child depends on nothing of its parent, so it keeps working if the parent is
// destroyed first. Every step counts against one deadline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "common/time_limit.h"
#include "monitor/log.h"
#include "runtime/internal_gather.h"
#include "runtime/peer.h"
#include "topology/selection.h"
#include "topology/text.h"

namespace taiji {

namespace {

constexpr const char* kSplitOpName = "taiji.split";
constexpr const char* kSplitAddressOpName = "taiji.split.addr";
// One rank's address record: a state byte, then "host:port" NUL-terminated. Room for any
// DNS name (253 bytes), brackets and a port.
constexpr size_t kAddressRecordBytes = 272;
enum : uint8_t { kNoServer = 0, kServing = 1, kServerFailed = 2 };
using Clock = std::chrono::steady_clock;

// Within the parent's job id's length cap (the child's job id travels as a frame name):
// the readable form when it fits, else a digest of it (16 bytes: every cap allows that).
std::string child_job_id(const Config& parent, uint64_t version, int color) {
  std::string id = parent.job_id + "/split" + std::to_string(version) + "/" + std::to_string(color);
  if (id.size() <= parent.max_name_len) return id;
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : id) h = (h ^ c) * 0x100000001b3ULL;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

}  // namespace

Result<std::unique_ptr<Peer>> Peer::split(int color, int key, int64_t timeout_ms) {
  if (on_io_thread()) {
    return Status{Code::InvalidArgument, "a split blocks; it cannot run from a completion callback"};
  }
  if (timeout_ms < 0) return Status{Code::InvalidArgument, "split: timeout_ms is negative"};
  const int64_t budget_ms = clamp_timeout_ms(timeout_ms == 0 ? config_.timeout_ms : timeout_ms);
  const auto deadline = Clock::now() + std::chrono::milliseconds(budget_ms);
  const int parent_size = size();
  const int me = rank();
  if (color < 0) color = -1;

  // 1. Every rank's (color, key).
  auto choice = std::make_shared<std::vector<uint8_t>>(2 * sizeof(int32_t));
  auto choices = std::make_shared<std::vector<uint8_t>>(2 * sizeof(int32_t) * static_cast<size_t>(parent_size));
  const int32_t mine[2] = {color, key};
  std::memcpy(choice->data(), mine, sizeof(mine));
  uint64_t version = 0;
  if (Status s = internal_gather(*this, "split", kSplitOpName, 0, choice, choices, DType::I32, 2, deadline, &version);
      !s.is_ok()) {
    return s;
  }
  std::vector<int32_t> all(2 * static_cast<size_t>(parent_size));
  std::memcpy(all.data(), choices->data(), choices->size());
  std::vector<std::pair<int32_t, int>> members;  // (key, parent rank) of my color
  for (int r = 0; color >= 0 && r < parent_size; ++r) {
    if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  const int child_size = static_cast<int>(members.size());
  const int child_rank = static_cast<int>(
      std::find_if(members.begin(), members.end(), [me](const auto& m) { return m.second == me; }) -
      members.begin());

  // 2. Where each child meets. Every rank takes part, also those that get no child.
  std::unique_ptr<RendezvousServer> server;
  Status server_status;
  auto record = std::make_shared<std::vector<uint8_t>>(kAddressRecordBytes, 0);
  if (color >= 0 && child_rank == 0 && child_size > 1) {
    auto started = RendezvousServer::start(config_.listen_host, 0);
    std::string address;
    if (started.is_ok()) {
      server = std::move(started.value());
      const bool v6 = config_.listen_host.find(':') != std::string::npos;
      address = (v6 ? "[" + config_.listen_host + "]" : config_.listen_host) + ":" +
                std::to_string(server->port());
    } else {
      server_status = started.status();
    }
    if (server_status.is_ok() && address.size() >= kAddressRecordBytes - 1) {
      server_status = {Code::Bootstrap, "split: the rendezvous address '" + address + "' is too long"};
      server.reset();
    }
    (*record)[0] = server_status.is_ok() ? kServing : kServerFailed;
    if (server_status.is_ok()) std::memcpy(record->data() + 1, address.data(), address.size());
  }
  auto records = std::make_shared<std::vector<uint8_t>>(kAddressRecordBytes * static_cast<size_t>(parent_size));
  if (Status s = internal_gather(*this, "split", kSplitAddressOpName, version, record, records, DType::U8,
                        kAddressRecordBytes, deadline, nullptr);
      !s.is_ok()) {
    return s;
  }
  if (!server_status.is_ok()) {
    return Status{server_status.code() == Code::Timeout ? Code::Bootstrap : server_status.code(),
                  "split: cannot start the child's rendezvous server: " + server_status.message()};
  }
  if (color < 0) return std::unique_ptr<Peer>();

  // 3. The child, configured as the parent.
  Config c = config_;
  c.rank = child_rank;
  c.size = child_size;
  c.host_rendezvous = 0;
  c.rendezvous.clear();
  if (child_size > 1) {
    const int root = members[0].second;
    const uint8_t* at = records->data() + kAddressRecordBytes * static_cast<size_t>(root);
    if (at[0] != kServing) {
      return Status{Code::Bootstrap, "split: rank " + std::to_string(root) +
                                         " (the child's rank 0) could not start the child's rendezvous server"};
    }
    c.rendezvous.assign(reinterpret_cast<const char*>(at + 1),
                        strnlen(reinterpret_cast<const char*>(at + 1), kAddressRecordBytes - 1));
  }
  c.job_id = child_job_id(config_, version, color);
  // The parent holds its Prometheus port (and the ports after it on this host).
  c.metrics_addr.clear();
  // An explicit graph is one of the parent's size; a built-in name fits any size.
  if (strategy_id(topology_text_body(c.topology)) == 0) c.topology.clear();
  const int64_t init_ms = left_ms(deadline);
  if (init_ms == 0) return Status{Code::Timeout, "split: no time left to connect the child"};
  c.init_timeout_ms = init_ms;
  log().debug("rank {} of {}: split {} color {} key {} -> rank {} of {} ({})", me, parent_size, version,
              color, key, child_rank, child_size, c.job_id);
  auto child = create(c, std::move(server));
  if (!child.is_ok()) {
    return Status{child.status().code(), "split: the child job '" + c.job_id + "' did not start: " +
                                             child.status().message()};
  }
  return std::move(child.value());
}

}  // namespace taiji
