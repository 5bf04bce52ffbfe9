#include "monitor/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "monitor/log.h"

namespace taiji {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxHeaderBytes = 8192;
constexpr auto kClientDeadline = std::chrono::seconds(5);
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
constexpr size_t kMaxClients = 32;

std::string errno_text(int err) { return std::system_category().message(err); }

struct Client {
  std::string in;
  std::string out;
  size_t sent = 0;
  bool answered = false;
  Clock::time_point deadline;
};

std::string response(int code, const char* reason, std::string_view type, std::string_view body,
                     bool head) {
  std::string out = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\n";
  out += "Content-Type: ";
  out += type;
  out += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n";
  if (code == 405) out += "Allow: GET, HEAD\r\n";
  out += "\r\n";
  if (!head) out += body;
  return out;
}

std::string error_response(int code, const char* reason) {
  return response(code, reason, "text/plain; charset=utf-8", std::string(reason) + "\n", false);
}

}  // namespace

struct MetricsServer::Impl {
  int listen_fd = -1;
  int wake_read = -1;
  int wake_write = -1;
  std::string address;
  Render render;
  std::map<int, Client> clients;
  std::thread thread;
  // Out of descriptors, the listener stays readable: poll would return at once, forever.
  Clock::time_point accept_paused_until{};

  ~Impl() {
    if (thread.joinable()) {
      char b = 1;
      while (write(wake_write, &b, 1) < 0 && errno == EINTR) {
      }
      thread.join();
    }
    for (auto& [fd, c] : clients) close(fd);
    for (int fd : {listen_fd, wake_read, wake_write}) {
      if (fd >= 0) close(fd);
    }
  }

  // Answers once the header block is complete (or can no longer be).
  void answer(Client& c) {
    const size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (c.in.size() > kMaxHeaderBytes) {
        c.out = error_response(431, "Request Header Fields Too Large");
        c.answered = true;
      }
      return;
    }
    c.answered = true;
    std::string_view line(c.in.data(), c.in.find("\r\n"));
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || line.substr(sp2 + 1).rfind("HTTP/1.", 0) != 0 ||
        line.find(' ', sp2 + 1) != std::string_view::npos) {
      c.out = error_response(400, "Bad Request");
      return;
    }
    const std::string_view method = line.substr(0, sp1);
    std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    target = target.substr(0, target.find('?'));
    if (method != "GET" && method != "HEAD") {
      c.out = error_response(405, "Method Not Allowed");
    } else if (target != "/metrics") {
      c.out = error_response(404, "Not Found");
    } else {
      c.out = response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", render(), method == "HEAD");
    }
  }

  void accept_all() {
    for (;;) {
      int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          accept_paused_until = Clock::now() + kAcceptPause;
        }
        return;
      }
      if (clients.size() >= kMaxClients) {
        close(fd);
        continue;
      }
      Client c;
      c.deadline = Clock::now() + kClientDeadline;
      clients.emplace(fd, std::move(c));
    }
  }

  // False when the connection is finished (answered and flushed, closed, or failed).
  bool serve(int fd, Client& c, short revents) {
    if (!c.answered && (revents & (POLLIN | POLLHUP | POLLERR))) {
      char buf[4096];
      ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) return false;
      if (n > 0) c.in.append(buf, static_cast<size_t>(n));
      answer(c);
    }
    if (c.answered) {
      while (c.sent < c.out.size()) {
        ssize_t n = send(fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n < 0) return errno == EAGAIN || errno == EINTR;
        c.sent += static_cast<size_t>(n);
      }
      return false;
    }
    return true;
  }

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake_read, POLLIN, 0});
      const bool accepting = Clock::now() >= accept_paused_until;
      fds.push_back({listen_fd, static_cast<short>(accepting ? POLLIN : 0), 0});
      auto next = accepting ? Clock::time_point::max() : accept_paused_until;
      for (auto& [fd, c] : clients) {
        fds.push_back({fd, static_cast<short>(c.answered ? POLLOUT : POLLIN), 0});
        next = std::min(next, c.deadline);
      }
      int timeout = -1;
      if (next != Clock::time_point::max()) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
        timeout = static_cast<int>(std::clamp<int64_t>(left, 0, 60000));
      }
      int rc = poll(fds.data(), fds.size(), timeout);
      if (rc < 0 && errno != EINTR) {
        log().error("metrics endpoint: poll failed: {}", errno_text(errno));
        return;
      }
      if (rc > 0 && fds[0].revents != 0) return;
      if (rc > 0 && (fds[1].revents & POLLIN)) accept_all();
      for (size_t i = 2; rc > 0 && i < fds.size(); ++i) {
        auto it = clients.find(fds[i].fd);
        if (it == clients.end() || fds[i].revents == 0) continue;
        if (!serve(it->first, it->second, fds[i].revents)) {
          close(it->first);
          clients.erase(it);
        }
      }
      const auto now = Clock::now();
      for (auto it = clients.begin(); it != clients.end();) {
        if (it->second.deadline <= now) {
          close(it->first);
          it = clients.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() = default;

const std::string& MetricsServer::address() const { return impl_->address; }

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& host, uint16_t port,
                                                            Render render) {
  const bool v6 = host.find(':') != std::string::npos;
  const std::string where = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  auto impl = std::make_unique<Impl>();
  impl->render = std::move(render);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int gai = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (gai != 0 || res == nullptr) {
    return Status(Code::Io, "metrics endpoint: cannot resolve " + where + ": " + gai_strerror(gai));
  }
  std::string why = "no usable address";
  for (addrinfo* ai = res; ai != nullptr && impl->listen_fd < 0; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      why = errno_text(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      why = errno_text(errno);
      close(fd);
      continue;
    }
    impl->listen_fd = fd;
  }
  freeaddrinfo(res);
  if (impl->listen_fd < 0) return Status(Code::Io, "metrics endpoint: cannot listen on " + where + ": " + why);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  const uint16_t bound = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                         : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  impl->address = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(bound);
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status(Code::Io, "metrics endpoint: pipe: " + errno_text(errno));
  }
  impl->wake_read = pipe_fds[0];
  impl->wake_write = pipe_fds[1];
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

std::string parse_metrics_address(const std::string& text, std::string* host, uint16_t* port) {
  std::string h = "127.0.0.1";
  std::string p = text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find("]:");
    if (close == std::string::npos) return "an IPv6 host must be [addr]:port";
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
    if (text.find(':') != colon) return "an IPv6 host must be [addr]:port";
    if (colon > 0) h = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  if (h.empty()) return "empty host";
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) {
    return "port '" + p + "' is not a number in 0..65535";
  }
  const unsigned long v = std::stoul(p);
  if (v > 65535) return "port '" + p + "' is not a number in 0..65535";
  *host = h;
  *port = static_cast<uint16_t>(v);
  return "";
}

}  // namespace taiji
