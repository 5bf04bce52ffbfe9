#include "common/socket_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <system_error>
#include <vector>

namespace taiji {

namespace {

using Clock = SocketServer::Clock;

constexpr auto kAcceptPause = std::chrono::milliseconds(100);

// Milliseconds left until `deadline`, rounded up so a poll never wakes just short of it.
int poll_timeout(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

// Reads what the socket holds, up to `cap` buffered; marks the connection dead at its end.
void read_some(SocketServer::Connection& c, size_t cap) {
  char buf[64 * 1024];
  while (!c.dead && c.in.size() < cap) {
    ssize_t n = recv(c.fd, buf, std::min(sizeof(buf), cap - c.in.size()), 0);
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

}  // namespace

std::string errno_text(int err) { return std::system_category().message(err); }

bool SocketServer::Connection::flush() {
  while (!out.empty() && !dead) {
    ssize_t n = send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      out.erase(0, static_cast<size_t>(n));
      last_sent = Clock::now();
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      dead = true;
    }
  }
  return !dead;
}

SocketServer::~SocketServer() {
  if (thread_.joinable()) {
    char b = 1;
    // The pipe only needs to become readable; a full pipe is already readable.
    while (write(wake_write_, &b, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (auto& [fd, c] : connections_) close(fd);
  for (int fd : {listen_fd_, wake_read_, wake_write_}) {
    if (fd >= 0) close(fd);
  }
}

void SocketServer::accept_all() {
  for (;;) {
    if (!options_.refuse_excess && connections_.size() >= options_.max_connections) {
      if (!warned_full_) {
        service_.failed(std::to_string(options_.max_connections) +
                            " clients connected, the most served at once; new connections "
                            "wait until one leaves",
                        false);
        warned_full_ = true;
      }
      return;
    }
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Out of descriptors (or similar): the pending connection stays queued and the
      // listener would stay readable, so back off instead of spinning.
      service_.failed("accept failed: " + errno_text(errno), false);
      accept_paused_until_ = Clock::now() + kAcceptPause;
      return;
    }
    if (connections_.size() >= options_.max_connections) {
      close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::unique_ptr<Connection> c = service_.open();
    c->fd = fd;
    c->opened = c->last_sent = Clock::now();
    connections_.emplace(fd, std::move(c));
  }
}

void SocketServer::run() {
  std::vector<pollfd> fds;
  for (;;) {
    // The Service's deadlines first, so that the places they free count for the accept.
    Clock::time_point next = service_.tick(connections_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->second->dead) {
        close(it->first);
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    fds.clear();
    fds.push_back({wake_read_, POLLIN, 0});
    const bool paused = Clock::now() < accept_paused_until_;
    const bool accepting =
        !paused && (options_.refuse_excess || connections_.size() < options_.max_connections);
    fds.push_back({listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    if (paused) next = std::min(next, accept_paused_until_);
    for (auto& [fd, c] : connections_) {
      short events = 0;
      if (!c->close_when_sent && c->in.size() < options_.input_cap) events |= POLLIN;
      if (!c->out.empty()) events |= POLLOUT;
      fds.push_back({fd, events, 0});
    }
    int rc = poll(fds.data(), fds.size(), poll_timeout(next));
    if (rc < 0 && errno != EINTR) {
      service_.failed("poll failed: " + errno_text(errno), true);
      return;
    }
    if (rc <= 0) continue;
    if (fds[0].revents != 0) return;
    if (fds[1].revents & POLLIN) accept_all();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto it = connections_.find(fds[i].fd);
      if (it == connections_.end()) continue;
      Connection& c = *it->second;
      if (fds[i].revents & POLLOUT) c.flush();
      if ((fds[i].revents & (POLLIN | POLLHUP)) && !c.close_when_sent) {
        read_some(c, options_.input_cap);
      }
      // A reset or fully shut-down peer can take no reply; a connection not being read
      // (input at its cap) would otherwise keep poll() waking on it.
      if (fds[i].revents & (POLLHUP | POLLERR | POLLNVAL)) c.dead = true;
      if (c.dead) continue;
      service_.input(c, connections_);
      c.flush();
      if (c.close_when_sent && c.out.empty()) c.dead = true;
    }
  }
}

Result<std::unique_ptr<SocketServer>> SocketServer::start(const std::string& host, uint16_t port,
                                                         Options options, Service& service) {
  const std::string where = (host.find(':') != std::string::npos ? "[" + host + "]" : host) +
                            ":" + std::to_string(port);
  const std::string name = options.name;
  const Code code = options.error_code;
  std::unique_ptr<SocketServer> server(new SocketServer(std::move(options), service));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service_text = std::to_string(port);
  int gai = getaddrinfo(host.empty() ? nullptr : host.c_str(), service_text.c_str(), &hints, &res);
  if (gai != 0) {
    std::string why = gai == EAI_SYSTEM ? errno_text(errno) : gai_strerror(gai);
    return Status(code, name + ": cannot resolve " + where + ": " + why);
  }
  // IPv4 first: a name such as "localhost" often resolves to ::1 first, and clients given
  // 127.0.0.1 (the launcher's default) must still reach the server.
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
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
        listen(fd, server->options_.backlog) != 0) {
      last_error = errno_text(errno);
      close(fd);
      continue;
    }
    server->listen_fd_ = fd;
    break;
  }
  freeaddrinfo(res);
  if (server->listen_fd_ < 0) {
    return Status(code, name + ": cannot listen on " + where + ": " + last_error);
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Status(code, name + ": getsockname on " + where + ": " + errno_text(errno));
  }
  server->port_ = ss.ss_family == AF_INET6
                      ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                      : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status(code, name + ": pipe: " + errno_text(errno));
  }
  server->wake_read_ = pipe_fds[0];
  server->wake_write_ = pipe_fds[1];
  SocketServer* raw = server.get();
  try {
    server->thread_ = std::thread([raw] { raw->run(); });
  } catch (const std::system_error& e) {
    return Status(code, name + ": cannot start thread: " + e.what());
  }
  return server;
}

}  // namespace taiji
