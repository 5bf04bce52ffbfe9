#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <deque>
#include <string_view>
#include <unordered_map>

#include "bootstrap/rendezvous.h"
#include "bootstrap/store_wire.h"
#include "common/socket_server.h"
#include "common/time_limit.h"
#include "monitor/log.h"

namespace taiji {

namespace {

using namespace store_wire;
using Clock = SocketServer::Clock;

// A well-behaved client has one request in flight; anything queued beyond this while a
// get or watch is parked (or while replies are not being read) is not read further until
// it drains.
constexpr size_t kInputCap = 2 * kMaxRequest;
constexpr size_t kOutputCap = 1 << 20;

struct Client final : SocketServer::Connection {
  Clock::time_point answered{};  // last answered (the epoch before any)
  bool parked = false;  // on a get ('G') or a watch ('W'): `request`
  Request request;
  Clock::time_point parked_deadline;

  Clock::time_point active() const { return std::max(answered, last_sent); }
};

Client& client(SocketServer::Connection& c) { return static_cast<Client&>(c); }

std::string byte(bool b) { return std::string(1, b ? '\1' : '\0'); }

// A counter's value, or nothing when the text is not one written by add.
std::optional<int64_t> counter(std::string_view text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

}  // namespace

struct RendezvousServer::Impl final : SocketServer::Service {
  RendezvousLimits limits;
  Clock::duration idle_limit{};
  std::unordered_map<std::string, std::string> store;
  uint64_t store_bytes = 0;  // keys and values, bounded by kRendezvousMaxStoreBytes
  std::deque<int> ready;     // clients whose buffered input may now be processable
  std::unique_ptr<SocketServer> server;  // last: stops before the store goes

  std::unique_ptr<SocketServer::Connection> open() override { return std::make_unique<Client>(); }
  void input(SocketServer::Connection& c, SocketServer::Connections& all) override {
    process_input(client(c), all);
  }
  Clock::time_point tick(SocketServer::Connections& all) override;
  void failed(const std::string& what, bool fatal) override {
    if (fatal) {
      log().error("rendezvous: {}", what);
    } else {
      log().warn("rendezvous: {}", what);
    }
  }

  void respond(Client& c, uint8_t status, std::string_view value);
  void bad(Client& c, const std::string& why);
  void process_input(Client& c, SocketServer::Connections& all);
  void handle(Client& c, Request& req, SocketServer::Connections& all);
  // Why `value` may not be stored at `key` now ("" when it may).
  std::string refuse_put(const std::string& key, const std::string& value) const;
  void put(const std::string& key, std::string value);
  // Answers a parked request if the store now lets it; false when it stays parked.
  bool try_answer(Client& c);
  void changed(const std::string& key, SocketServer::Connections& all);
};

void RendezvousServer::Impl::respond(Client& c, uint8_t status, std::string_view value) {
  c.answered = Clock::now();
  const bool was_full = c.out.size() >= kOutputCap;
  c.out += encode_reply(status, value);
  c.flush();
  if (was_full && c.out.size() < kOutputCap) ready.push_back(c.fd);
}

void RendezvousServer::Impl::bad(Client& c, const std::string& why) {
  log().debug("rendezvous: closing client fd {}: {}", c.fd, why);
  // Best effort, so the client can report something better than a reset.
  std::string r = encode_reply(kStatusBadRequest, {});
  [[maybe_unused]] ssize_t n = send(c.fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  c.dead = true;
}

void RendezvousServer::Impl::process_input(Client& c, SocketServer::Connections& all) {
  size_t pos = 0;
  while (!c.dead && !c.parked && c.out.size() < kOutputCap) {
    Request req;
    size_t used = 0;
    std::string why;
    Parse p = parse_request(std::string_view(c.in).substr(pos), &req, &used, &why);
    if (p == Parse::Incomplete) break;
    if (p == Parse::Bad) {
      bad(c, why);
      break;
    }
    pos += used;
    handle(c, req, all);
  }
  c.in.erase(0, pos);
}

std::string RendezvousServer::Impl::refuse_put(const std::string& key,
                                               const std::string& value) const {
  auto old = store.find(key);
  if (old == store.end() && store.size() >= limits.max_keys) {
    return "the store holds " + std::to_string(store.size()) + " keys, the most it may";
  }
  const uint64_t freed = old == store.end() ? 0 : old->first.size() + old->second.size();
  if (store_bytes - freed + key.size() + value.size() > kRendezvousMaxStoreBytes) {
    return "the store is full (" + std::to_string(store_bytes) + " bytes)";
  }
  return "";
}

void RendezvousServer::Impl::put(const std::string& key, std::string value) {
  auto [it, fresh] = store.try_emplace(key);
  store_bytes -= fresh ? 0 : it->first.size() + it->second.size();
  store_bytes += key.size() + value.size();
  it->second = std::move(value);
}

bool RendezvousServer::Impl::try_answer(Client& c) {
  auto it = store.find(c.request.key);
  const bool present = it != store.end();
  if (c.request.op == 'G') {
    if (!present) return false;
    c.parked = false;
    respond(c, kStatusOk, it->second);
    return true;
  }
  const bool same = c.request.absent ? !present : present && it->second == c.request.expected;
  if (same) return false;
  c.parked = false;
  respond(c, kStatusOk, byte(present) + (present ? it->second : std::string()));
  return true;
}

void RendezvousServer::Impl::changed(const std::string& key, SocketServer::Connections& all) {
  for (auto& [fd, conn] : all) {
    Client& other = client(*conn);
    if (other.parked && !other.dead && other.request.key == key && try_answer(other)) {
      ready.push_back(fd);
    }
  }
}

void RendezvousServer::Impl::handle(Client& c, Request& req, SocketServer::Connections& all) {
  auto it = store.find(req.key);
  const bool present = it != store.end();
  switch (req.op) {
    case 'S': {
      if (std::string why = refuse_put(req.key, req.value); !why.empty()) return bad(c, why);
      put(req.key, std::move(req.value));
      respond(c, kStatusOk, {});
      return changed(req.key, all);
    }
    case 'A': {
      std::optional<int64_t> now = present ? counter(it->second) : int64_t{0};
      int64_t sum = 0;
      if (!now) {
        return respond(c, kStatusInvalid, "the value of '" + req.key + "' is not a counter");
      }
      if (__builtin_add_overflow(*now, req.delta, &sum)) {
        return respond(c, kStatusInvalid, "adding " + std::to_string(req.delta) + " to '" +
                                              req.key + "' overflows");
      }
      std::string text = std::to_string(sum);
      if (std::string why = refuse_put(req.key, text); !why.empty()) {
        return respond(c, kStatusLimit, why);
      }
      put(req.key, std::move(text));
      std::string value;
      append_i64(value, sum);
      respond(c, kStatusOk, value);
      return changed(req.key, all);
    }
    case 'C': {
      const bool matches = req.absent ? !present : present && it->second == req.expected;
      if (matches) {
        if (std::string why = refuse_put(req.key, req.value); !why.empty()) {
          return respond(c, kStatusLimit, why);
        }
        put(req.key, req.value);
        respond(c, kStatusOk, byte(true) + byte(true) + req.value);
        return changed(req.key, all);
      }
      return respond(c, kStatusOk, byte(false) + byte(present) + (present ? it->second : ""));
    }
    case 'D': {
      if (present) {
        store_bytes -= it->first.size() + it->second.size();
        store.erase(it);
      }
      respond(c, kStatusOk, byte(present));
      if (present) changed(req.key, all);
      return;
    }
    default:  // 'G' and 'W': answered now, or parked until the key lets them be
      break;
  }
  c.request = std::move(req);
  c.parked = true;
  if (try_answer(c)) return;
  c.parked = false;
  if (c.request.timeout_ms == 0) return respond(c, kStatusTimeout, {});
  if (c.request.op == 'W') {
    size_t watchers = 0;
    for (auto& [fd, conn] : all) {
      const Client& other = client(*conn);
      watchers += other.parked && !other.dead && other.request.op == 'W';
    }
    if (watchers >= limits.max_watchers) {
      return respond(c, kStatusLimit, std::to_string(watchers) +
                                          " watches are waiting, the most the server holds");
    }
  }
  c.parked = true;
  c.parked_deadline =
      Clock::now() + std::chrono::milliseconds(clamp_timeout_ms(c.request.timeout_ms));
}

Clock::time_point RendezvousServer::Impl::tick(SocketServer::Connections& all) {
  auto now = Clock::now();
  for (auto& [fd, conn] : all) {
    Client& c = client(*conn);
    if (c.parked && !c.dead && c.parked_deadline <= now) {
      c.parked = false;
      respond(c, kStatusTimeout, {});
      ready.push_back(fd);
    }
  }
  while (!ready.empty()) {
    int fd = ready.front();
    ready.pop_front();
    auto it = all.find(fd);
    if (it != all.end()) process_input(client(*it->second), all);
  }
  now = Clock::now();
  auto next = Clock::time_point::max();
  for (auto& [fd, conn] : all) {
    Client& c = client(*conn);
    if (c.dead) continue;
    // Waiting on the store is not idling: the wait has its own deadline.
    if (c.parked) {
      next = std::min(next, c.parked_deadline);
    } else if (now - c.active() >= idle_limit) {
      log().debug("rendezvous: closing client fd {}: no request completed for {} ms", fd,
                  std::chrono::duration_cast<std::chrono::milliseconds>(idle_limit).count());
      c.dead = true;
    } else {
      next = std::min(next, c.active() + idle_limit);
    }
  }
  return next;
}

RendezvousServer::RendezvousServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RendezvousServer::~RendezvousServer() = default;

uint16_t RendezvousServer::port() const { return impl_->server->port(); }

Result<std::unique_ptr<RendezvousServer>> RendezvousServer::start(const std::string& host,
                                                                  uint16_t port,
                                                                  RendezvousLimits limits) {
  auto impl = std::make_unique<Impl>();
  impl->limits = limits;
  if (impl->limits.max_clients == 0) {
    rlimit fds{};
    rlim_t soft = getrlimit(RLIMIT_NOFILE, &fds) == 0 ? fds.rlim_cur : 1024;
    impl->limits.max_clients = static_cast<size_t>(
        std::clamp<rlim_t>(soft == RLIM_INFINITY ? 1 << 20 : soft / 2, 16, 1 << 20));
  }
  impl->idle_limit = std::chrono::milliseconds(clamp_timeout_ms(limits.idle_ms));
  SocketServer::Options options;
  options.name = "rendezvous";
  options.error_code = Code::Bootstrap;
  options.max_connections = impl->limits.max_clients;
  options.refuse_excess = false;
  options.input_cap = kInputCap;
  options.backlog = SOMAXCONN;
  auto server = SocketServer::start(host, port, std::move(options), *impl);
  if (!server.is_ok()) return server.status();
  impl->server = std::move(server.value());
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(std::move(impl)));
}

}  // namespace taiji
