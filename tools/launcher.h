// taiji-run's launcher: the ranks it runs on this host, their output, and how the job
// follows their ends, signals and (elastic) membership changes. taiji_run.cpp runs the job;
// launcher_elastic.cpp holds what --elastic adds, on one host and across hosts.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "elastic_watch.h"
#include "run_options.h"

namespace taiji_run {

using Clock = std::chrono::steady_clock;

// "taiji-run: <message>" on stderr.
void say(const std::string& message);

struct Stream {
  int fd = -1;
  int out_fd = 1;
  std::string buf;
};

struct Child {
  int rank = 0;  // the rank it started as: its output prefix
  pid_t pid = -1;
  bool running = false;
  Stream out, err;
  // Leads a process group of its own, so that a signal reaches what it started too.
  bool own_group = false;
  bool detached = false;  // elastic: dropped by a smaller membership, exits by itself
  int slot = 0;           // its TAIJI_LOCAL_RANK
};

class Launcher {
 public:
  explicit Launcher(Options o) : opts_(std::move(o)) {}
  int run();

 private:
  bool spawn(int rank, int local_rank, int local_size, const std::string& path,
             const std::map<std::string, std::string>& vars);
  void pump(Stream& s, int rank, bool final_drain);
  void reap();
  // Elastic: a member or detached rank ended (failed: nonzero exit or signal).
  void elastic_ended(size_t index, bool failed, int code, const std::string& what);
  // Elastic: J/elastic/cluster changed; starts the ranks a grow adds or detaches the
  // ranks a smaller membership leaves out.
  void elastic_change(const Membership& m);
  int running_members() const;
  // Elastic with --hosts: the counterparts of the two above, for a launcher that knows only
  // its own processes (docs/launcher.md#elastic-jobs-on-several-hosts).
  bool across_hosts() const { return opts_.elastic && !opts_.hosts.empty(); }
  void hosts_ended(size_t index, bool failed, int code, const std::string& what);
  void hosts_change(const Membership& m);
  // Claims and starts the ranks of the pending grow while this host has free slots.
  void claim_pending(bool retry);
  // The lowest TAIJI_LOCAL_RANK no running process holds; -1 when every slot is taken.
  int free_slot() const;
  // Whether a launcher whose processes have all ended stays: while processes run on
  // other hosts (J/elastic/running), since it may serve their store or start joiners.
  bool job_goes_on();
  // Sends sig to every rank's process group (from_terminal: not to a rank that shares
  // ours, which the terminal signalled itself), then SIGKILL after the grace period.
  void stop(int sig, bool from_terminal = false);
  void notify(int sig);
  // Whatever the ranks started that is still running once they have all exited.
  void kill_leftovers();
  int running_count() const;
  std::string others(int n) const {
    return std::to_string(n) + (n == 1 ? " rank" : " ranks");
  }

  Options opts_;
  std::vector<Child> children_;
  std::optional<int> exit_code_;
  bool stopping_ = false;
  std::optional<rlimit> ranks_nofile_;  // the descriptor limit the ranks start with
  std::optional<Clock::time_point> kill_at_;
  std::optional<Clock::time_point> detached_stop_at_;  // members all ended; detached ranks get a grace
  std::string path_;                          // the program every rank runs
  std::map<std::string, std::string> vars_;   // the TAIJI_* variables common to all ranks
  // Elastic: children_ indices of the job's members in rank order, and the membership
  // version they belong to.
  std::vector<size_t> members_;
  int64_t version_ = 1;

  // Elastic with --hosts.
  std::unique_ptr<ElasticClaims> claims_;
  int slots_ = 0;             // this host's count in --hosts
  int64_t cluster_size_ = 0;  // the size of membership version_
  std::vector<int> pending_;  // ranks of membership version_ nobody has claimed yet
  Clock::time_point pending_until_;
  std::optional<int> last_end_;   // the status of the last process here to end
  std::optional<int> last_loss_;  // the status of the last one that failed
  std::optional<Clock::time_point> next_count_check_;
  bool said_waiting_ = false;
};

}  // namespace taiji_run
