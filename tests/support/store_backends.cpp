#include "store_backends.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "bootstrap/etcd_store.h"
#include "bootstrap/rendezvous.h"
#include "bootstrap/store_open.h"

namespace taiji_test {

using namespace taiji;

namespace {

// One etcd for the whole test program: starting one takes about a second.
class Etcd {
 public:
  static Etcd& get() {
    static Etcd etcd;
    return etcd;
  }
  int client_port() const { return client_port_; }
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
    client_port_ = unused_port();
    const int peer_port = unused_port();
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
    auto up = EtcdStore::connect("etcd://127.0.0.1:" + std::to_string(client_port_) + "/", 20000);
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

class Embedded final : public StoreBackend {
 public:
  Embedded() {
    auto r = RendezvousServer::start("127.0.0.1", 0);
    INFO(r.status().message());
    REQUIRE(r.is_ok());
    server_ = std::move(r.value());
  }
  std::unique_ptr<Store> client() override {
    auto r = RendezvousClient::connect(address(), 5000);
    INFO(r.status().message());
    REQUIRE(r.is_ok());
    return std::move(r.value());
  }
  std::string address() const override { return "127.0.0.1:" + std::to_string(server_->port()); }

 private:
  std::unique_ptr<RendezvousServer> server_;
};

class OnEtcd final : public StoreBackend {
 public:
  OnEtcd() {
    static std::atomic<int> made{0};
    prefix_ = "backend" + std::to_string(getpid()) + "-" + std::to_string(++made);
  }
  std::unique_ptr<Store> client() override {
    auto r = open_store(address(), 5000);
    INFO(r.status().message());
    REQUIRE(r.is_ok());
    return std::move(r.value());
  }
  std::string address() const override { return etcd_address(prefix_); }

 private:
  std::string prefix_;
};

}  // namespace

std::unique_ptr<StoreBackend> store_backend(const std::string& name) {
  if (name == "etcd") return std::make_unique<OnEtcd>();
  REQUIRE(name == "embedded");
  return std::make_unique<Embedded>();
}

std::string etcd_address(const std::string& prefix) {
  return "etcd://127.0.0.1:" + std::to_string(Etcd::get().client_port()) + "/" + prefix;
}

int unused_port() {
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

}  // namespace taiji_test
