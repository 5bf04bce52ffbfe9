#include "elastic_watch.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bootstrap/store_open.h"

namespace taiji_run {

namespace {

// How long one watch waits before the thread looks at its stop flag again: the launcher's
// exit waits at most this long for the thread.
constexpr int64_t kPollMs = 300;
// A value no elastic key ever holds: a watch that "knows" it returns at once with what
// the key holds now (std::nullopt: absent), which reads a key without waiting for it.
const std::string kNever(1, '\0');

bool parse_count(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  *out = std::strtoll(s.c_str(), nullptr, 10);
  return true;
}

}  // namespace

std::string elastic_key(const std::string& job_id, const char* name) {
  return job_id + "/elastic/" + name;
}

std::optional<Membership> parse_membership(const std::string& text) {
  size_t space = text.find(' ');
  Membership m;
  if (space == std::string::npos || !parse_count(text.substr(0, space), &m.version) ||
      !parse_count(text.substr(space + 1), &m.size) || m.version < 1 || m.size < 1) {
    return std::nullopt;
  }
  return m;
}

taiji::Result<std::unique_ptr<ElasticWatch>> ElasticWatch::start(const std::string& address,
                                                                  const std::string& job_id,
                                                                  const Options& opts,
                                                                  int64_t timeout_ms) {
  auto opened = taiji::open_store(address, timeout_ms);
  if (!opened.is_ok()) return opened.status();
  std::unique_ptr<taiji::Store> store = std::move(opened.value());
  const std::string limits = std::to_string(opts.min_np) + " " + std::to_string(opts.max_np);
  taiji::Status st = store->set(elastic_key(job_id, "limits"), limits, timeout_ms);
  if (!st.is_ok()) return st;
  // Not over a membership rank 0 has written already (the ranks of a job on an etcd store
  // may have started before this launcher, under another one that died).
  const std::string key = elastic_key(job_id, "cluster");
  auto cas = store->compare_and_set(key, std::nullopt, "1 " + std::to_string(opts.np), timeout_ms);
  if (!cas.is_ok()) return cas.status();
  std::unique_ptr<ElasticWatch> w(
      new ElasticWatch(address, key, std::move(store), cas.value().current));
  if (w->pipe_[0] < 0) {
    return taiji::Status(taiji::Code::Io, std::string("pipe: ") + std::strerror(errno));
  }
  w->thread_ = std::thread([p = w.get()] { p->loop(); });
  return w;
}

ElasticWatch::ElasticWatch(std::string address, std::string key,
                           std::unique_ptr<taiji::Store> store, std::optional<std::string> known)
    : address_(std::move(address)), key_(std::move(key)), store_(std::move(store)),
      known_(std::move(known)) {
  if (pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) pipe_[0] = pipe_[1] = -1;
}

ElasticWatch::~ElasticWatch() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  for (int fd : pipe_) {
    if (fd >= 0) close(fd);
  }
}

void ElasticWatch::post(Event e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  char b = 0;
  // A full pipe already wakes the loop, which then takes every queued event.
  [[maybe_unused]] ssize_t n = write(pipe_[1], &b, 1);
}

std::vector<ElasticWatch::Event> ElasticWatch::take() {
  char buf[256];
  while (read(pipe_[0], buf, sizeof(buf)) > 0) {
  }
  std::lock_guard<std::mutex> lock(mu_);
  return std::move(events_);
}

void ElasticWatch::loop() {
  bool reported = false;  // a lost store is reported once, not at every retry
  while (!stop_) {
    if (!store_) {
      auto opened = taiji::open_store(address_, kPollMs);
      if (!opened.is_ok()) continue;
      store_ = std::move(opened.value());
    }
    auto got = store_->watch(key_, known_, kPollMs);
    if (!got.is_ok()) {
      if (got.status().code() == taiji::Code::Timeout) continue;
      if (!reported) {
        post({std::nullopt, "lost the store while watching " + key_ + ": " +
                                got.status().message() + "; retrying"});
        reported = true;
      }
      store_.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
      continue;
    }
    reported = false;
    known_ = got.value();
    if (!known_) continue;  // deleted: nothing to follow until it is written again
    if (auto m = parse_membership(*known_)) {
      post({m, ""});
    } else {
      post({std::nullopt, "ignoring " + key_ + " = '" + *known_ + "' (expected \"<version> <size>\")"});
    }
  }
}

taiji::Result<std::unique_ptr<ElasticClaims>> ElasticClaims::open(const std::string& address,
                                                                  const std::string& job_id,
                                                                  int64_t timeout_ms) {
  auto opened = taiji::open_store(address, timeout_ms);
  if (!opened.is_ok()) return opened.status();
  return std::unique_ptr<ElasticClaims>(
      new ElasticClaims(address, job_id, timeout_ms, std::move(opened.value())));
}

template <typename Fn>
auto ElasticClaims::with_store(Fn&& fn) -> decltype(fn(std::declval<taiji::Store&>())) {
  if (broken_) return *broken_;
  for (int attempt = 0;; ++attempt) {
    if (!store_) {
      auto opened = taiji::open_store(address_, timeout_ms_);
      if (!opened.is_ok()) {
        broken_ = opened.status();
        return *broken_;
      }
      store_ = std::move(opened.value());
    }
    auto result = fn(*store_);
    if (result.is_ok()) return result;
    const taiji::Code code = result.status().code();
    if (code != taiji::Code::Io && code != taiji::Code::Bootstrap) return result;
    store_.reset();
    if (attempt > 0) {
      broken_ = result.status();
      return result;
    }
  }
}

taiji::Result<std::string> ElasticClaims::claim(int64_t version, int rank, const std::string& host) {
  const std::string key = job_id_ + "/elastic/v" + std::to_string(version) + "/claim/" +
                          std::to_string(rank);
  return with_store([&](taiji::Store& s) -> taiji::Result<std::string> {
    auto cas = s.compare_and_set(key, std::nullopt, host, timeout_ms_);
    if (!cas.is_ok()) return cas.status();
    if (!cas.value().current) {
      return taiji::Status(taiji::Code::Protocol, key + " is absent right after a claim");
    }
    return *cas.value().current;
  });
}

taiji::Result<int64_t> ElasticClaims::add_running(int64_t delta) {
  const std::string key = elastic_key(job_id_, "running");
  return with_store([&](taiji::Store& s) { return s.add(key, delta, timeout_ms_); });
}

taiji::Result<std::optional<int64_t>> ElasticClaims::running() {
  const std::string key = elastic_key(job_id_, "running");
  return with_store([&](taiji::Store& s) -> taiji::Result<std::optional<int64_t>> {
    auto got = s.watch(key, kNever, timeout_ms_);
    if (!got.is_ok()) return got.status();
    if (!got.value()) return std::optional<int64_t>();
    char* end = nullptr;
    const long long n = std::strtoll(got.value()->c_str(), &end, 10);
    if (got.value()->empty() || *end != '\0') {
      return taiji::Status(taiji::Code::Protocol, key + " holds '" + *got.value() + "', not a count");
    }
    return std::optional<int64_t>(n);
  });
}

int run_resize(const Options& opts) {
  const int64_t timeout_ms = static_cast<int64_t>((opts.timeout_s > 0 ? opts.timeout_s : 5) * 1000);
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "taiji-run: --resize: %s\n", why.c_str());
    return 1;
  };
  auto opened = taiji::open_store(opts.store, timeout_ms);
  if (!opened.is_ok()) {
    return fail("cannot reach the store at " + opts.store + ": " + opened.status().message());
  }
  taiji::Store& store = *opened.value();
  const std::string limits_key = elastic_key(opts.job_id, "limits");
  auto limits = store.watch(limits_key, kNever, timeout_ms);
  if (!limits.is_ok()) return fail("cannot read " + limits_key + ": " + limits.status().message());
  if (limits.value()) {
    auto range = parse_membership(*limits.value());  // "<min> <max>" has the same shape
    if (!range) {
      return fail(limits_key + " holds '" + *limits.value() + "', expected \"<min> <max>\"");
    }
    if (opts.resize < range->version || opts.resize > range->size) {
      std::fprintf(stderr,
                   "taiji-run: --resize %d is outside job %s's limits: --min-np %lld, --max-np "
                   "%lld\n",
                   opts.resize, opts.job_id.c_str(), static_cast<long long>(range->version),
                   static_cast<long long>(range->size));
      return 2;
    }
  } else {
    std::fprintf(stderr,
                 "taiji-run: --resize: no %s in the store (a job not started by taiji-run "
                 "--elastic?); writing the request anyway\n",
                 limits_key.c_str());
  }
  const std::string request_key = elastic_key(opts.job_id, "request");
  taiji::Status st = store.set(request_key, std::to_string(opts.resize), timeout_ms);
  if (!st.is_ok()) return fail("cannot write " + request_key + ": " + st.message());
  std::string now;
  auto cluster = store.watch(elastic_key(opts.job_id, "cluster"), kNever, timeout_ms);
  if (cluster.is_ok() && cluster.value()) {
    if (auto m = parse_membership(*cluster.value())) {
      now = " (membership now: version " + std::to_string(m->version) + ", " +
            std::to_string(m->size) + " ranks)";
    }
  }
  std::printf("taiji-run: asked job %s for %d ranks: %s = %d at %s%s\n", opts.job_id.c_str(),
              opts.resize, request_key.c_str(), opts.resize, opts.store.c_str(), now.c_str());
  return 0;
}

}  // namespace taiji_run
