// The membership-change path: fired with a new version of the same members, every
// component takes it (ops run on the new version between peers that both changed), and
// frames of the old version are then refused with an error naming both versions.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/membership.h"
#include "runtime/peer.h"

using namespace taiji;

namespace {

// A loopback port that nothing listened on a moment ago.
uint16_t free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

Config peer_config(int rank, int size, uint16_t port) {
  Config c;
  c.rank = rank;
  c.size = size;
  c.rendezvous = "127.0.0.1:" + std::to_string(port);
  c.host_rendezvous = rank == 0 ? 1 : 0;
  c.timeout_ms = 5000;
  c.init_timeout_ms = 10000;
  c.log_level = "off";
  auto resolved = resolve_config(c, [](const char*) -> const char* { return nullptr; });
  INFO(resolved.status().message());
  REQUIRE(resolved.is_ok());
  return resolved.value();
}

std::vector<std::unique_ptr<Peer>> start_peers(int size) {
  const uint16_t port = free_port();
  std::vector<std::future<Result<std::unique_ptr<Peer>>>> made;
  for (int r = 0; r < size; ++r) {
    Config c = peer_config(r, size, port);
    made.push_back(std::async(std::launch::async, [c] { return Peer::create(c); }));
  }
  std::vector<std::unique_ptr<Peer>> peers;
  for (auto& f : made) {
    REQUIRE(f.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
    auto p = f.get();
    INFO(p.status().message());
    REQUIRE(p.is_ok());
    peers.push_back(std::move(p.value()));
  }
  return peers;
}

struct Allreduce {
  std::vector<float> data;
  std::shared_ptr<RequestState> request;
};

Allreduce post_allreduce(Peer& peer, const std::string& name, size_t count, int64_t timeout_ms) {
  Allreduce a;
  a.data.assign(count, static_cast<float>(peer.rank() + 1));
  PostArgs args;
  args.name = name;
  args.send = a.data.data();
  args.recv = a.data.data();
  args.count = count;
  args.timeout_ms = timeout_ms;
  auto posted = peer.post(args);
  INFO(posted.status().message());
  REQUIRE(posted.is_ok());
  a.request = posted.value();
  return a;
}

Status wait(const Allreduce& a) {
  Status s{Code::Internal, "not done"};
  REQUIRE(a.request->wait_for(10000, &s));
  return s;
}

// The same members at a higher version: what a resize that changes nothing would fire.
Cluster next_version(const Peer& peer, const Cluster& now, uint32_t version) {
  Cluster next = now;
  next.version = version;
  next.rank = peer.rank();
  return next;
}

}  // namespace

TEST_CASE("a membership change needs a higher version and a whole cluster", "[membership]") {
  Membership m(1, 3, 1);
  m.set_addresses({"a:1", "b:2", "c:3"}, {0, 0, 1});
  struct Recorder : ClusterListener {
    std::vector<std::pair<uint32_t, uint32_t>> seen;
    void cluster_changed(const Cluster& before, const Cluster& now) override {
      seen.emplace_back(before.version, now.version);
    }
  } first, second;
  m.add_listener(&first);
  m.add_listener(&second);
  Cluster next = m.current();
  next.version = 1;
  Status s = m.change(next);
  CHECK(s.code() == Code::InvalidArgument);
  CHECK(s.message() == "cluster version 1 does not follow the current version 1");
  next.version = 2;
  next.rank = 3;
  CHECK(m.change(next).message() == "rank 3 is not a rank of a 3-peer cluster");
  next.rank = 0;
  s = m.change(next);
  CHECK(s.code() == Code::Unsupported);
  CHECK(s.message() == "a membership change keeps the ranks for now: rank 1 of 3 cannot become rank 0 of 3");
  next.rank = 1;
  next.addresses.pop_back();
  CHECK(m.change(next).message() == "a cluster of 3 ranks needs an address and a host for each");
  CHECK(m.version() == 1);
  CHECK(first.seen.empty());
  next.addresses.push_back("c:3");
  REQUIRE(m.change(next).is_ok());
  CHECK(m.version() == 2);
  CHECK(m.snapshot()->version == 2);
  CHECK(m.current().host_of == std::vector<int>{0, 0, 1});
  CHECK(first.seen == std::vector<std::pair<uint32_t, uint32_t>>{{1, 2}});
  CHECK(second.seen == first.seen);
}

TEST_CASE("every component takes a membership change; frames of the old version are refused",
          "[membership]") {
  auto peers = start_peers(2);
  for (auto& p : peers) REQUIRE(p->cluster_version() == 1);
  // Version 1: an allreduce over TCP (small) and one over shared memory (large).
  for (size_t count : {size_t{4}, size_t{1} << 16}) {
    auto a = post_allreduce(*peers[0], "before", count, 5000);
    auto b = post_allreduce(*peers[1], "before", count, 5000);
    REQUIRE(wait(a).is_ok());
    REQUIRE(wait(b).is_ok());
    CHECK(a.data == std::vector<float>(count, 3.0f));
  }

  Cluster now;
  now.size = 2;
  now.addresses = {"unused:1", "unused:2"};
  now.host_of = {0, 0};
  for (auto& p : peers) {
    Status s = p->change_membership(next_version(*p, now, 2));
    INFO(s.message());
    REQUIRE(s.is_ok());
    CHECK(p->cluster_version() == 2);
    CHECK(p->rank() == next_version(*p, now, 2).rank);
    CHECK(p->size() == 2);
  }
  // Both sides stamp and check version 2 now: the transports, the engine and the poster
  // took it, and the metrics report it.
  for (size_t count : {size_t{4}, size_t{1} << 16}) {
    auto a = post_allreduce(*peers[0], "after", count, 5000);
    auto b = post_allreduce(*peers[1], "after", count, 5000);
    Status sa = wait(a), sb = wait(b);
    INFO(sa.message() << " / " << sb.message());
    REQUIRE(sa.is_ok());
    REQUIRE(sb.is_ok());
    CHECK(a.data == std::vector<float>(count, 3.0f));
  }
  CHECK(peers[0]->metrics().prometheus().find("taiji_cluster_version{rank=\"0\"} 2") != std::string::npos);

  // Rank 0 alone moves to version 3: rank 1's frames, still of version 2, are refused.
  // Only rank 1 posts, so that the refusal seen is rank 0's of rank 1's frame.
  REQUIRE(peers[0]->change_membership(next_version(*peers[0], now, 3)).is_ok());
  auto b = post_allreduce(*peers[1], "split", 4, 3000);
  Status sb = wait(b);
  INFO(sb.message());
  CHECK(sb.code() == Code::PeerLost);
  Status lost = peers[0]->async_error();
  for (int i = 0; i < 250 && lost.is_ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    lost = peers[0]->async_error();
  }
  INFO(lost.message());
  CHECK(lost.code() == Code::PeerLost);
  CHECK(lost.message().find("cluster_version 2 does not match 3") != std::string::npos);
  // A lower version than the current one is refused, and changes nothing.
  Status back = peers[1]->change_membership(next_version(*peers[1], now, 1));
  CHECK(back.code() == Code::InvalidArgument);
  CHECK(peers[1]->cluster_version() == 2);
  for (auto& p : peers) p->abort();
}
