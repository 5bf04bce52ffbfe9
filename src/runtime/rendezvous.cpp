#include "runtime/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "monitor/log.h"
#include "common/time_limit.h"
#include "transport/address.h"

namespace taiji {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMaxKey = kRendezvousMaxKey;
constexpr uint32_t kMaxValue = kRendezvousMaxValue;
constexpr size_t kMaxRequest = 1 + 4 + kMaxKey + 4 + kMaxValue;
// A well-behaved client has one request in flight; anything queued beyond this while a 'G'
// is parked (or while replies are not being read) is not read further until it drains.
constexpr size_t kInputCap = 2 * kMaxRequest;
constexpr size_t kOutputCap = 1 << 20;
// How long past a 'G''s own timeout the client waits for the server's timeout answer.
constexpr int64_t kReplyGraceMs = 5000;
constexpr int kRetrySleepMs = 20;

constexpr uint8_t kStatusOk = 0;
constexpr uint8_t kStatusTimeout = 1;
constexpr uint8_t kStatusBadRequest = 2;

std::string errno_text(int err) { return std::system_category().message(err); }

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

std::string reply(uint8_t status, std::string_view value) {
  std::string out;
  out.reserve(5 + value.size());
  out.push_back(static_cast<char>(status));
  put_u32(out, static_cast<uint32_t>(value.size()));
  out.append(value);
  return out;
}

// Milliseconds left until `deadline`, rounded up so a poll never wakes just short of it.
int ms_until(Clock::time_point deadline) {
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

Clock::time_point deadline_after(int64_t ms) {
  return Clock::now() + std::chrono::milliseconds(clamp_timeout_ms(ms));
}

std::string sockaddr_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "?";
}

std::string peer_text(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "rendezvous server";
  return "rendezvous server " + sockaddr_text(reinterpret_cast<sockaddr*>(&ss));
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Server

namespace {

struct Client {
  int fd = -1;
  std::string in;
  std::string out;
  bool dead = false;
  Clock::time_point active;  // accepted, last answered, or last had reply bytes sent
  bool parked = false;
  std::string parked_key;
  Clock::time_point parked_deadline;
};

}  // namespace

struct RendezvousServer::Impl {
  int listen_fd = -1;
  int wake_read = -1;
  int wake_write = -1;
  uint16_t port = 0;
  std::thread thread;

  std::unordered_map<std::string, std::string> store;
  uint64_t store_bytes = 0;  // keys and values, bounded by kRendezvousMaxStoreBytes
  std::unordered_map<int, Client> clients;
  std::deque<int> ready;  // clients whose buffered input may now be processable
  Clock::time_point accept_paused_until{};
  size_t max_clients = 0;
  Clock::duration idle_limit{};
  bool warned_full = false;

  ~Impl() {
    if (thread.joinable()) {
      char b = 'x';
      // The pipe only needs to become readable; a full pipe is already readable.
      [[maybe_unused]] ssize_t n = write(wake_write, &b, 1);
      thread.join();
    }
    for (auto& [fd, c] : clients) close(fd);
    for (int fd : {listen_fd, wake_read, wake_write}) {
      if (fd >= 0) close(fd);
    }
  }

  void run();
  void accept_all();
  void read_from(Client& c);
  void flush(Client& c);
  void respond(Client& c, uint8_t status, std::string_view value);
  void process_input(Client& c);
  void expire_parked();
  Clock::time_point close_idle();
};

void RendezvousServer::Impl::respond(Client& c, uint8_t status, std::string_view value) {
  c.active = Clock::now();
  c.out += reply(status, value);
  flush(c);
}

void RendezvousServer::Impl::flush(Client& c) {
  size_t before = c.out.size();
  while (!c.out.empty() && !c.dead) {
    ssize_t n = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      c.out.erase(0, static_cast<size_t>(n));
      c.active = Clock::now();
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      c.dead = true;
    }
  }
  if (before >= kOutputCap && c.out.size() < kOutputCap) ready.push_back(c.fd);
}

void RendezvousServer::Impl::read_from(Client& c) {
  char buf[64 * 1024];
  while (!c.dead && c.in.size() < kInputCap) {
    size_t want = std::min(sizeof(buf), kInputCap - c.in.size());
    ssize_t n = recv(c.fd, buf, want, 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      c.dead = true;  // an unfinished request from a departed client is simply dropped
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      break;
    } else {
      c.dead = true;
    }
  }
}

void RendezvousServer::Impl::process_input(Client& c) {
  size_t pos = 0;
  auto bad = [&](const std::string& why) {
    log().debug("rendezvous: closing client fd {}: {}", c.fd, why);
    // Best effort, so the client can report something better than a reset.
    std::string r = reply(kStatusBadRequest, {});
    [[maybe_unused]] ssize_t n = send(c.fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    c.dead = true;
  };
  while (!c.dead && !c.parked && c.out.size() < kOutputCap) {
    size_t avail = c.in.size() - pos;
    const char* p = c.in.data() + pos;
    if (avail < 1) break;
    char op = p[0];
    if (op != 'S' && op != 'G') {
      bad("unknown op " + std::to_string(static_cast<uint8_t>(op)));
      break;
    }
    if (avail < 5) break;
    uint32_t key_len = get_u32(p + 1);
    if (key_len > kMaxKey) {
      bad("key of " + std::to_string(key_len) + " bytes");
      break;
    }
    if (avail < 5 + size_t{key_len} + 4) break;
    std::string key(p + 5, key_len);
    uint32_t arg = get_u32(p + 5 + key_len);
    if (op == 'S') {
      if (arg > kMaxValue) {
        bad("value of " + std::to_string(arg) + " bytes for key '" + key + "'");
        break;
      }
      size_t total = 5 + size_t{key_len} + 4 + arg;
      if (avail < total) break;
      std::string value(p + 9 + key_len, arg);
      auto old = store.find(key);
      const uint64_t freed = old == store.end() ? 0 : old->first.size() + old->second.size();
      if (store_bytes - freed + key.size() + value.size() > kRendezvousMaxStoreBytes) {
        bad("the store is full (" + std::to_string(store_bytes) + " bytes)");
        break;
      }
      store_bytes += key.size() + value.size() - freed;
      pos += total;
      for (auto& [fd, other] : clients) {
        if (other.parked && !other.dead && other.parked_key == key) {
          other.parked = false;
          respond(other, kStatusOk, value);
          ready.push_back(fd);
        }
      }
      store[key] = std::move(value);
      respond(c, kStatusOk, {});
    } else {
      pos += 5 + size_t{key_len} + 4;
      auto it = store.find(key);
      if (it != store.end()) {
        respond(c, kStatusOk, it->second);
      } else if (arg == 0) {
        respond(c, kStatusTimeout, {});
      } else {
        c.parked = true;
        c.parked_key = std::move(key);
        c.parked_deadline = deadline_after(arg);
      }
    }
  }
  c.in.erase(0, pos);
}

void RendezvousServer::Impl::expire_parked() {
  auto now = Clock::now();
  for (auto& [fd, c] : clients) {
    if (c.parked && !c.dead && c.parked_deadline <= now) {
      c.parked = false;
      respond(c, kStatusTimeout, {});
      ready.push_back(fd);
    }
  }
}

// Closes clients idle past the limit; returns when the next one would be.
Clock::time_point RendezvousServer::Impl::close_idle() {
  auto now = Clock::now();
  auto next = Clock::time_point::max();
  for (auto& [fd, c] : clients) {
    // Waiting on the store is not idling: the wait has its own deadline.
    if (c.dead || c.parked) continue;
    if (now - c.active >= idle_limit) {
      log().debug("rendezvous: closing client fd {}: no request completed for {} ms", fd,
                  std::chrono::duration_cast<std::chrono::milliseconds>(idle_limit).count());
      c.dead = true;
    } else {
      next = std::min(next, c.active + idle_limit);
    }
  }
  return next;
}

void RendezvousServer::Impl::accept_all() {
  while (clients.size() < max_clients) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      set_nodelay(fd);
      Client c;
      c.fd = fd;
      c.active = Clock::now();
      clients.emplace(fd, std::move(c));
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    // Out of descriptors (or similar): the pending connection stays queued and the
    // listener would stay readable, so back off instead of spinning.
    log().warn("rendezvous: accept failed: {}", errno_text(errno));
    accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
    return;
  }
  if (!warned_full) {
    log().warn("rendezvous: {} clients connected, the most served at once; new connections "
               "wait until one leaves", max_clients);
    warned_full = true;
  }
}

void RendezvousServer::Impl::run() {
  std::vector<pollfd> fds;
  for (;;) {
    // Idle clients first, so that the places they free count for the accept below.
    Clock::time_point next = close_idle();
    for (auto it = clients.begin(); it != clients.end();) {
      if (it->second.dead) {
        close(it->first);
        it = clients.erase(it);
      } else {
        ++it;
      }
    }
    fds.clear();
    fds.push_back({wake_read, POLLIN, 0});
    bool paused = Clock::now() < accept_paused_until;
    bool accepting = !paused && clients.size() < max_clients;
    fds.push_back({listen_fd, static_cast<short>(accepting ? POLLIN : 0), 0});
    if (paused) next = std::min(next, accept_paused_until);
    for (auto& [fd, c] : clients) {
      short events = 0;
      if (c.in.size() < kInputCap) events |= POLLIN;
      if (!c.out.empty()) events |= POLLOUT;
      fds.push_back({fd, events, 0});
      if (c.parked) next = std::min(next, c.parked_deadline);
    }
    int timeout = next == Clock::time_point::max() ? -1 : ms_until(next);
    int rc = poll(fds.data(), fds.size(), timeout);
    if (rc < 0 && errno != EINTR) {
      log().error("rendezvous: poll failed: {}", errno_text(errno));
      return;
    }
    if (rc > 0) {
      if (fds[0].revents != 0) return;
      if (fds[1].revents & POLLIN) accept_all();
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto it = clients.find(fds[i].fd);
        if (it == clients.end()) continue;
        Client& c = it->second;
        if (fds[i].revents & POLLOUT) flush(c);
        if (fds[i].revents & (POLLIN | POLLHUP)) read_from(c);
        // A reset or fully shut-down peer can take no reply; a client not being read
        // (input at its cap) would otherwise keep poll() waking on it.
        if (fds[i].revents & (POLLHUP | POLLERR | POLLNVAL)) c.dead = true;
        process_input(c);
      }
    }
    expire_parked();
    while (!ready.empty()) {
      int fd = ready.front();
      ready.pop_front();
      auto it = clients.find(fd);
      if (it != clients.end()) process_input(it->second);
    }
  }
}

RendezvousServer::RendezvousServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RendezvousServer::~RendezvousServer() = default;

uint16_t RendezvousServer::port() const { return impl_->port; }

Result<std::unique_ptr<RendezvousServer>> RendezvousServer::start(const std::string& host,
                                                                  uint16_t port,
                                                                  RendezvousLimits limits) {
  std::string where = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                      std::to_string(port);
  auto impl = std::make_unique<Impl>();
  impl->max_clients = limits.max_clients;
  if (impl->max_clients == 0) {
    rlimit fds{};
    rlim_t soft = getrlimit(RLIMIT_NOFILE, &fds) == 0 ? fds.rlim_cur : 1024;
    impl->max_clients = static_cast<size_t>(
        std::clamp<rlim_t>(soft == RLIM_INFINITY ? 1 << 20 : soft / 2, 16, 1 << 20));
  }
  impl->idle_limit = std::chrono::milliseconds(clamp_timeout_ms(limits.idle_ms));

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  int gai = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &res);
  if (gai != 0) {
    std::string why = gai == EAI_SYSTEM ? errno_text(errno) : gai_strerror(gai);
    return Status(Code::Bootstrap, "rendezvous: cannot resolve " + where + ": " + why);
  }
  // IPv4 first: a name such as "localhost" often resolves to ::1 first, and peers given
  // 127.0.0.1 (the launcher's default) must still reach the store.
  std::vector<addrinfo*> candidates;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) candidates.push_back(ai);
  std::stable_partition(candidates.begin(), candidates.end(),
                        [](const addrinfo* ai) { return ai->ai_family == AF_INET; });
  std::string last_error = "no usable address";
  for (addrinfo* ai : candidates) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
    if (fd < 0) {
      last_error = errno_text(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      last_error = errno_text(errno);
      close(fd);
      continue;
    }
    impl->listen_fd = fd;
    break;
  }
  freeaddrinfo(res);
  if (impl->listen_fd < 0) {
    return Status(Code::Bootstrap, "rendezvous: cannot listen on " + where + ": " + last_error);
  }

  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Status(Code::Bootstrap, "rendezvous: getsockname on " + where + ": " +
                                       errno_text(errno));
  }
  impl->port = ss.ss_family == AF_INET6
                   ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                   : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status(Code::Bootstrap, "rendezvous: pipe: " + errno_text(errno));
  }
  impl->wake_read = pipe_fds[0];
  impl->wake_write = pipe_fds[1];

  Impl* raw = impl.get();
  try {
    impl->thread = std::thread([raw] { raw->run(); });
  } catch (const std::system_error& e) {
    return Status(Code::Bootstrap, std::string("rendezvous: cannot start thread: ") + e.what());
  }
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(std::move(impl)));
}

// ---------------------------------------------------------------------------------------
// Client

namespace {

enum class IoResult { Ok, Timeout, Closed, Error };

struct Io {
  IoResult result;
  int err;
};

Io send_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return {IoResult::Error, errno};
    pollfd p{fd, POLLOUT, 0};
    int rc = poll(&p, 1, ms_until(deadline));
    if (rc < 0 && errno != EINTR) return {IoResult::Error, errno};
    if (rc == 0) return {IoResult::Timeout, 0};
  }
  return {IoResult::Ok, 0};
}

Io recv_all(int fd, char* buf, size_t len, Clock::time_point deadline) {
  size_t off = 0;
  while (off < len) {
    ssize_t n = recv(fd, buf + off, len - off, 0);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return {IoResult::Closed, 0};
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return {IoResult::Error, errno};
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, ms_until(deadline));
    if (rc < 0 && errno != EINTR) return {IoResult::Error, errno};
    if (rc == 0) return {IoResult::Timeout, 0};
  }
  return {IoResult::Ok, 0};
}

std::string io_text(const Io& io) {
  switch (io.result) {
    case IoResult::Ok: return "ok";
    case IoResult::Timeout: return "timed out";
    case IoResult::Closed: return "connection closed by the server";
    case IoResult::Error: return errno_text(io.err);
  }
  return "?";
}

// One attempt at every address of `host`; returns the connected socket or -1.
int try_connect(const std::string& host, const std::string& port, Clock::time_point deadline,
                std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int gai = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) {
    *error = gai == EAI_SYSTEM ? errno_text(errno) : gai_strerror(gai);
    return -1;
  }
  int result = -1;
  for (addrinfo* ai = res; ai != nullptr && result < 0; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
    if (fd < 0) {
      *error = errno_text(errno);
      continue;
    }
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int prc;
      do {
        prc = poll(&p, 1, ms_until(deadline));
      } while (prc < 0 && errno == EINTR);
      if (prc <= 0) {
        *error = prc == 0 ? "timed out" : errno_text(errno);
        close(fd);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      *error = errno_text(errno);
      close(fd);
      continue;
    }
    // Retrying loopback connects to a port in the ephemeral range can end up connected
    // to itself (TCP simultaneous open) when nothing listens there yet.
    sockaddr_storage self{}, peer{};
    socklen_t self_len = sizeof(self), peer_len = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) == 0 &&
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 &&
        self_len == peer_len && std::memcmp(&self, &peer, self_len) == 0) {
      *error = "connected to itself (nothing listening)";
      close(fd);
      continue;
    }
    set_nodelay(fd);
    result = fd;
  }
  freeaddrinfo(res);
  return result;
}

}  // namespace

RendezvousClient::RendezvousClient(int fd) : fd_(fd) {}

RendezvousClient::~RendezvousClient() {
  if (fd_ >= 0) close(fd_);
}

Result<std::unique_ptr<RendezvousClient>> RendezvousClient::connect(const std::string& address,
                                                                    int64_t timeout_ms) {
  std::string host;
  uint16_t port_number = 0;
  if (!split_host_port(address, false, &host, &port_number).empty()) {
    return Status(Code::Bootstrap,
                  "rendezvous: bad address '" + address + "' (expected host:port)");
  }
  std::string port = std::to_string(port_number);
  auto deadline = deadline_after(timeout_ms);
  std::string error = "no attempt made";
  for (;;) {
    int fd = try_connect(host, port, deadline, &error);
    if (fd >= 0) return std::unique_ptr<RendezvousClient>(new RendezvousClient(fd));
    int left = ms_until(deadline);
    if (left <= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(left, kRetrySleepMs)));
  }
  return Status(Code::Bootstrap, "rendezvous: cannot connect to " + address + " within " +
                                     std::to_string(timeout_ms) + " ms: " + error);
}

Status RendezvousClient::set(const std::string& key, const std::string& value, int64_t timeout_ms) {
  if (key.size() > kMaxKey || value.size() > kMaxValue) {
    return Status(Code::InvalidArgument,
                  "rendezvous: set '" + key.substr(0, 64) + "': key is " +
                      std::to_string(key.size()) + " bytes (max " + std::to_string(kMaxKey) +
                      "), value " + std::to_string(value.size()) + " bytes (max " +
                      std::to_string(kMaxValue) + ")");
  }
  if (fd_ < 0) {
    return Status(Code::Bootstrap,
                  "rendezvous: set '" + key + "': connection lost by an earlier error");
  }
  std::string server = peer_text(fd_);
  auto fail = [&](const std::string& why) {
    // The stream may hold half a message now; nothing after this could be trusted.
    close(fd_);
    fd_ = -1;
    return Status(Code::Bootstrap, "rendezvous: set '" + key + "' on " + server + ": " + why);
  };
  std::string req;
  req.reserve(9 + key.size() + value.size());
  req.push_back('S');
  put_u32(req, static_cast<uint32_t>(key.size()));
  req += key;
  put_u32(req, static_cast<uint32_t>(value.size()));
  req += value;
  auto deadline = deadline_after(timeout_ms);
  Io io = send_all(fd_, req, deadline);
  if (io.result != IoResult::Ok) return fail(io_text(io));
  char hdr[5];
  io = recv_all(fd_, hdr, sizeof(hdr), deadline);
  if (io.result != IoResult::Ok) return fail(io_text(io));
  uint8_t status = static_cast<uint8_t>(hdr[0]);
  uint32_t len = get_u32(hdr + 1);
  if (status != kStatusOk || len != 0) {
    return fail(status == kStatusBadRequest ? "rejected as a bad request"
                                            : "unexpected reply (status " +
                                                  std::to_string(status) + ")");
  }
  return Status::ok();
}

Result<std::string> RendezvousClient::get(const std::string& key, int64_t timeout_ms) {
  if (key.size() > kMaxKey) {
    return Status(Code::InvalidArgument, "rendezvous: get '" + key.substr(0, 64) + "...': key is " +
                                             std::to_string(key.size()) + " bytes (max " +
                                             std::to_string(kMaxKey) + ")");
  }
  if (fd_ < 0) {
    return Status(Code::Bootstrap,
                  "rendezvous: get '" + key + "': connection lost by an earlier error");
  }
  std::string server = peer_text(fd_);
  auto fail = [&](Code code, const std::string& why) {
    close(fd_);
    fd_ = -1;
    return Status(code, "rendezvous: get '" + key + "' from " + server + ": " + why);
  };
  uint32_t wire_timeout =
      static_cast<uint32_t>(std::clamp<int64_t>(timeout_ms, 0, int64_t{UINT32_MAX}));
  std::string req;
  req.reserve(9 + key.size());
  req.push_back('G');
  put_u32(req, static_cast<uint32_t>(key.size()));
  req += key;
  put_u32(req, wire_timeout);
  auto deadline = deadline_after(int64_t{wire_timeout} + kReplyGraceMs);
  Io io = send_all(fd_, req, deadline);
  if (io.result != IoResult::Ok) return fail(Code::Bootstrap, io_text(io));
  char hdr[5];
  io = recv_all(fd_, hdr, sizeof(hdr), deadline);
  if (io.result == IoResult::Timeout) {
    return fail(Code::Timeout, "no reply within " + std::to_string(wire_timeout) + " ms");
  }
  if (io.result != IoResult::Ok) return fail(Code::Bootstrap, io_text(io));
  uint8_t status = static_cast<uint8_t>(hdr[0]);
  uint32_t len = get_u32(hdr + 1);
  if (status == kStatusTimeout && len == 0) {
    return Status(Code::Timeout, "rendezvous: key '" + key + "' not set within " +
                                     std::to_string(wire_timeout) + " ms (" + server + ")");
  }
  if (status != kStatusOk || len > kMaxValue) {
    return fail(Code::Bootstrap, status == kStatusBadRequest
                                     ? "rejected as a bad request"
                                     : "unexpected reply (status " + std::to_string(status) +
                                           ", length " + std::to_string(len) + ")");
  }
  std::string value(len, '\0');
  io = recv_all(fd_, value.data(), len, deadline);
  if (io.result != IoResult::Ok) return fail(Code::Bootstrap, io_text(io));
  return value;
}

}  // namespace taiji
