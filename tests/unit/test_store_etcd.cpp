// The Store interface over a real etcd (Debian's etcd-server), started here on loopback
// with a data directory of its own, and the address parsing of open_store.
#include <signal.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/etcd_store.h"
#include "bootstrap/rendezvous.h"
#include "bootstrap/store_open.h"

using namespace taiji;
using Clock = std::chrono::steady_clock;

namespace {

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// One etcd for the whole test program: starting one takes about a second.
class Etcd {
 public:
  static Etcd& get() {
    static Etcd etcd;
    return etcd;
  }
  std::string address(const std::string& prefix) const {
    return "etcd://127.0.0.1:" + std::to_string(client_port_) + "/" + prefix;
  }
  ~Etcd() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

 private:
  Etcd() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/taiji-etcd-XXXXXX";
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    dir_ = pattern;
    client_port_ = free_port();
    const int peer_port = free_port();
    const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
    std::vector<std::string> args = {"etcd", "--name", "taiji-test", "--data-dir", dir_ + "/data",
                                     "--listen-client-urls", client, "--advertise-client-urls", client,
                                     "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                     "--initial-cluster", "taiji-test=" + peer, "--log-level", "error"};
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      // etcd logs its raft steps whatever the level: keep them beside its data.
      const std::string log = dir_ + "/etcd.log";
      FILE* out = std::freopen(log.c_str(), "w", stdout);
      if (out != nullptr) dup2(fileno(out), 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execvp("etcd", argv.data());
      _exit(127);
    }
    auto up = EtcdStore::connect(address(""), 20000);
    int status = 0;
    if (!up.is_ok() && waitpid(pid_, &status, WNOHANG) == pid_ && WIFEXITED(status) &&
        WEXITSTATUS(status) == 127) {
      pid_ = -1;
      FAIL("etcd is not installed: run scripts/setup.sh (it installs etcd-server)");
    }
    INFO(up.status().message());
    REQUIRE(up.is_ok());
  }
  std::string dir_;
  int client_port_ = 0;
  pid_t pid_ = -1;
};

std::unique_ptr<Store> open(const std::string& prefix) {
  auto s = open_store(Etcd::get().address(prefix), 5000);
  INFO(s.status().message());
  REQUIRE(s.is_ok());
  return std::move(s.value());
}

int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

}  // namespace

TEST_CASE("etcd store: set and get any bytes, get waits for a later set", "[etcd]") {
  auto a = open("setget");
  auto b = open("setget");
  const std::string bytes("a\0b\n\"\\\xff", 8);
  REQUIRE(a->set("k", bytes, 2000).is_ok());
  auto got = b->get("k", 2000);
  REQUIRE(got.is_ok());
  CHECK(got.value() == bytes);
  REQUIRE(a->set("empty", "", 2000).is_ok());
  CHECK(b->get("empty", 2000).value() == "");
  auto later = std::async(std::launch::async, [&] { return b->get("late", 5000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(a->set("late", "v", 2000).is_ok());
  auto l = later.get();
  REQUIRE(l.is_ok());
  CHECK(l.value() == "v");
  const auto t0 = Clock::now();
  auto missing = b->get("never", 300);
  CHECK(missing.status().code() == Code::Timeout);
  CHECK_THAT(missing.status().message(), Catch::Contains("never"));
  CHECK(ms_since(t0) >= 290);
  CHECK(ms_since(t0) < 3000);
}

TEST_CASE("etcd store: add counts atomically across clients; a non-number is refused", "[etcd]") {
  constexpr int kThreads = 4, kAdds = 25;
  std::vector<std::future<bool>> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.push_back(std::async(std::launch::async, [] {
      auto s = open_store(Etcd::get().address("add"), 5000);
      if (!s.is_ok()) return false;
      for (int i = 0; i < kAdds; ++i) {
        if (!s.value()->add("n", 1, 10000).is_ok()) return false;
      }
      return true;
    }));
  }
  for (auto& w : workers) CHECK(w.get());
  auto s = open("add");
  CHECK(s->add("n", 0, 2000).value() == kThreads * kAdds);
  CHECK(s->get("n", 2000).value() == std::to_string(kThreads * kAdds));
  CHECK(s->add("fresh", -3, 2000).value() == -3);
  REQUIRE(s->set("text", "abc", 2000).is_ok());
  auto bad = s->add("text", 1, 2000);
  CHECK(bad.status().code() == Code::InvalidArgument);
  CHECK(s->get("text", 2000).value() == "abc");
  REQUIRE(s->set("big", std::to_string(INT64_MAX), 2000).is_ok());
  CHECK(s->add("big", 1, 2000).status().code() == Code::InvalidArgument);
  CHECK(s->get("big", 2000).value() == std::to_string(INT64_MAX));
}

TEST_CASE("etcd store: compare-and-set swaps only from what it expects", "[etcd]") {
  auto s = open("cas");
  auto first = s->compare_and_set("k", std::nullopt, "one", 2000);
  REQUIRE(first.is_ok());
  CHECK(first.value().swapped);
  CHECK(first.value().current == std::optional<std::string>("one"));
  auto again = s->compare_and_set("k", std::nullopt, "two", 2000);
  REQUIRE(again.is_ok());
  CHECK_FALSE(again.value().swapped);
  CHECK(again.value().current == std::optional<std::string>("one"));
  auto wrong = s->compare_and_set("k", std::string("zzz"), "two", 2000);
  CHECK_FALSE(wrong.value().swapped);
  CHECK(wrong.value().current == std::optional<std::string>("one"));
  auto right = s->compare_and_set("k", std::string("one"), "two", 2000);
  CHECK(right.value().swapped);
  CHECK(s->get("k", 2000).value() == "two");
  auto absent = s->compare_and_set("gone", std::string("x"), "y", 2000);
  CHECK_FALSE(absent.value().swapped);
  CHECK_FALSE(absent.value().current.has_value());
}

TEST_CASE("etcd store: delete and watch see every change; prefixes keep jobs apart", "[etcd]") {
  auto s = open("watch");
  auto other = open("watch-other");
  CHECK_FALSE(s->remove("k", 2000).value());
  REQUIRE(s->set("k", "a", 2000).is_ok());
  CHECK(other->watch("k", std::nullopt, 200).status().code() == Code::Timeout);
  auto w = open("watch");
  auto changed = std::async(std::launch::async, [&] { return w->watch("k", std::string("a"), 5000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(s->set("k", "b", 2000).is_ok());
  auto c = changed.get();
  REQUIRE(c.is_ok());
  CHECK(c.value() == std::optional<std::string>("b"));
  auto deleted = std::async(std::launch::async, [&] { return w->watch("k", std::string("b"), 5000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(s->remove("k", 2000).value());
  auto d = deleted.get();
  REQUIRE(d.is_ok());
  CHECK_FALSE(d.value().has_value());
  auto still = w->watch("k", std::nullopt, 200);
  CHECK(still.status().code() == Code::Timeout);
  CHECK_THAT(still.status().message(), Catch::Contains("'k'"));
  CHECK(w->watch("k", std::nullopt, -1).status().code() == Code::InvalidArgument);
}

TEST_CASE("etcd store: bad input and an etcd that is not there", "[etcd]") {
  auto s = open("bad");
  CHECK(s->set(std::string(kRendezvousMaxKey + 1, 'k'), "v", 2000).code() == Code::InvalidArgument);
  CHECK(s->set("k", std::string(kRendezvousMaxValue + 1, 'v'), 2000).code() == Code::InvalidArgument);
  for (const char* address : {"etcd://", "etcd://host", "etcd://host:0/p", "etcd://host:99999/p",
                              "etcd://:2379/p", "etcd://host:23x9/p", "zk://host:1/p", "nocolon"}) {
    auto r = open_store(address, 1000);
    INFO(address << ": " << r.status().message());
    CHECK(r.status().code() == Code::InvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(address));
  }
  const int closed = free_port();
  const auto t0 = Clock::now();
  auto none = open_store("etcd://127.0.0.1:" + std::to_string(closed) + "/x", 500);
  CHECK(none.status().code() == Code::Bootstrap);
  CHECK_THAT(none.status().message(), Catch::Contains("127.0.0.1:" + std::to_string(closed)));
  CHECK(ms_since(t0) < 3000);
}

TEST_CASE("open_store gives the embedded store for host:port", "[etcd]") {
  auto server = RendezvousServer::start("127.0.0.1", 0);
  REQUIRE(server.is_ok());
  auto s = open_store("127.0.0.1:" + std::to_string(server.value()->port()), 2000);
  REQUIRE(s.is_ok());
  REQUIRE(s.value()->set("k", "v", 2000).is_ok());
  CHECK(s.value()->get("k", 2000).value() == "v");
}
