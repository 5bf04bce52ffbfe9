// taiji-run's side of elastic membership (docs/launcher.md#elastic-jobs): the store keys the
// runtime and the launcher share, a thread that watches the job's membership in the store and
// hands each change to the launcher's poll loop, and the `--resize` client.
//
// Keys, for job id J: "J/elastic/cluster" = "<version> <size>" (written by rank 0 when a
// membership starts; version 1 by taiji-run), "J/elastic/request" = "<size>" (an operator's
// request; "0" or absent: none), "J/elastic/limits" = "<min> <max>" (written by taiji-run).
// With --hosts also "J/elastic/v<V>/claim/<r>" = the host that starts rank r of membership V
// (the first launcher to set it), and "J/elastic/running" = the processes the launchers run.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store.h"
#include "common/status.h"
#include "run_options.h"

namespace taiji_run {

std::string elastic_key(const std::string& job_id, const char* name);

struct Membership {
  int64_t version = 0;
  int64_t size = 0;
};

// "<version> <size>", both decimal and >= 1, one space; std::nullopt for anything else.
std::optional<Membership> parse_membership(const std::string& text);

// Watches J/elastic/cluster on a thread of its own, since every store call blocks. The
// poll loop waits for fd() to be readable and then calls take().
class ElasticWatch {
 public:
  struct Event {
    std::optional<Membership> membership;  // a new, well-formed cluster value
    std::string message;                   // otherwise: what went wrong (a line to print)
  };

  // Connects to the store, writes J/elastic/limits, and J/elastic/cluster = "1 <np>" unless
  // the key is there already; then starts watching. Fails if the store does not answer
  // within timeout_ms.
  static taiji::Result<std::unique_ptr<ElasticWatch>> start(const std::string& address,
                                                            const std::string& job_id,
                                                            const Options& opts,
                                                            int64_t timeout_ms);
  // Stops the thread; returns within about a watch period (kPollMs).
  ~ElasticWatch();
  ElasticWatch(const ElasticWatch&) = delete;
  ElasticWatch& operator=(const ElasticWatch&) = delete;

  int fd() const { return pipe_[0]; }
  // The events since the last call, oldest first; empties the pipe.
  std::vector<Event> take();

 private:
  ElasticWatch(std::string address, std::string key, std::unique_ptr<taiji::Store> store,
               std::optional<std::string> known);
  void loop();
  void post(Event e);

  std::string address_;
  std::string key_;
  std::unique_ptr<taiji::Store> store_;  // the thread's alone once it runs
  std::optional<std::string> known_;
  int pipe_[2] = {-1, -1};
  std::mutex mu_;
  std::vector<Event> events_;  // guarded by mu_
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The poll loop's own connection to the store, for a multi-host elastic job: the claims on
// the ranks a grow adds and the count of processes running on all hosts. Each call blocks
// for at most the timeout given to open(); after a call fails to reach the store, the
// following ones fail at once (the job's store is gone: nothing more to coordinate).
class ElasticClaims {
 public:
  static taiji::Result<std::unique_ptr<ElasticClaims>> open(const std::string& address,
                                                            const std::string& job_id,
                                                            int64_t timeout_ms);
  // Claims rank `rank` of membership `version` for `host` unless a launcher did already;
  // returns the host that holds the claim (`host`: this launcher won it).
  taiji::Result<std::string> claim(int64_t version, int rank, const std::string& host);
  // Adds delta to J/elastic/running; returns the new count.
  taiji::Result<int64_t> add_running(int64_t delta);
  // J/elastic/running; std::nullopt while absent (no launcher has started a process yet).
  taiji::Result<std::optional<int64_t>> running();

 private:
  ElasticClaims(std::string address, std::string job_id, int64_t timeout_ms,
                std::unique_ptr<taiji::Store> store)
      : address_(std::move(address)), job_id_(std::move(job_id)), timeout_ms_(timeout_ms),
        store_(std::move(store)) {}
  // Runs fn on the store, with one fresh connection when the old one was closed (the
  // embedded store closes idle ones).
  template <typename Fn>
  auto with_store(Fn&& fn) -> decltype(fn(std::declval<taiji::Store&>()));

  std::string address_;
  std::string job_id_;
  int64_t timeout_ms_;
  std::unique_ptr<taiji::Store> store_;
  std::optional<taiji::Status> broken_;  // why the store could not be reached
};

// taiji-run --resize N --store ADDR --job-id J: checks N against J/elastic/limits and writes
// J/elastic/request = N. Returns the exit status (0 done, 1 store unreachable, 2 N out of
// the job's limits).
int run_resize(const Options& opts);

}  // namespace taiji_run
