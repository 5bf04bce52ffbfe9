// What --elastic adds to the launcher (docs/launcher.md#elastic-jobs): on one host it knows
// every member and its rank; across hosts (--hosts) each launcher knows only its own
// processes, and the ranks a grow adds are claimed through the store.
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "launcher.h"

namespace taiji_run {

namespace {

// How long after a grow's announcement a slot that comes free here (a detached process
// exiting late, say) still takes a rank nobody has claimed: the joiners must connect within
// the resize's own deadline anyway.
constexpr auto kClaimWindow = std::chrono::seconds(5);
// How often a launcher whose processes have ended reads J/elastic/running.
constexpr auto kCountPoll = std::chrono::milliseconds(300);

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

}  // namespace

int Launcher::running_members() const {
  int n = 0;
  for (size_t i : members_) n += children_[i].running;
  return n;
}

// A member that fails leaves the job: the survivors shrink and renumber densely in the old
// order, which is this list without it. Its exit code ends the job only when too few
// members are left running.
void Launcher::elastic_ended(size_t index, bool failed, int code, const std::string& what) {
  const std::string name = "rank " + std::to_string(children_[index].rank);
  auto it = std::find(members_.begin(), members_.end(), index);
  if (it == members_.end()) {
    if (failed) say(name + " (detached) " + what + "; the job goes on");
    return;
  }
  if (!failed) return;
  members_.erase(it);
  const int left = running_members();
  if (left >= opts_.min_np) {
    say(name + " " + what + "; it leaves the job, " + others(left) + (left == 1 ? " goes" : " go") +
        " on (elastic)");
    return;
  }
  say(name + " " + what);
  say(others(left) + " left, below --min-np " + std::to_string(opts_.min_np) +
      "; stopping the job");
  exit_code_ = code;
  stop(SIGTERM);
}

void Launcher::elastic_change(const taiji_run::Membership& m) {
  // The survivors agree on a shrink only after a member died, so it is a zombie by now:
  // out of the list first, or the sizes below would drop a live one.
  reap();
  if (stopping_ || m.version <= version_) return;
  version_ = m.version;
  const int have = static_cast<int>(members_.size());
  const std::string head = "membership version " + std::to_string(m.version) + " has " +
                           others(static_cast<int>(std::min<int64_t>(m.size, 1 << 30)));
  if (m.size > have) {
    const std::string ranks = std::to_string(have) + ".." + std::to_string(m.size - 1);
    if (m.size > opts_.max_np) {
      say(head + ", above --max-np " + std::to_string(opts_.max_np) + "; not starting ranks " +
          ranks);
      return;
    }
    say(head + "; starting ranks " + ranks);
    std::map<std::string, std::string> vars = vars_;
    vars["TAIJI_WORLD_SIZE"] = std::to_string(m.size);
    vars["TAIJI_CLUSTER_VERSION"] = std::to_string(m.version);
    for (int r = have; r < m.size; ++r) {
      if (!spawn(r, r, static_cast<int>(m.size), path_, vars)) {
        say("cannot start rank " + std::to_string(r) + ": " + std::strerror(errno) +
            "; the job goes on without it");
        break;
      }
    }
  } else if (m.size < have) {
    std::string left;
    for (size_t i = static_cast<size_t>(m.size); i < members_.size(); ++i) {
      children_[members_[i]].detached = true;
      left += (left.empty() ? "" : ", ") + std::to_string(children_[members_[i]].rank);
    }
    members_.resize(static_cast<size_t>(m.size));
    say(head + "; detached (exiting by themselves): rank " + left);
  }
}


int Launcher::free_slot() const {
  std::vector<bool> taken(static_cast<size_t>(slots_), false);
  for (const auto& c : children_) {
    if (c.running && c.slot >= 0 && c.slot < slots_) taken[static_cast<size_t>(c.slot)] = true;
  }
  auto it = std::find(taken.begin(), taken.end(), false);
  return it == taken.end() ? -1 : static_cast<int>(it - taken.begin());
}

// Without the global ranks (a shrink after a loss renumbers them on every host), an end
// is judged by its status alone: 0 is a finished or detached process, anything else a loss
// the survivors shrink past; --min-np is checked against J/elastic/cluster instead.
void Launcher::hosts_ended(size_t index, bool failed, int code, const std::string& what) {
  if (claims_) {
    auto n = claims_->add_running(-1);
    if (!n.is_ok() && !stopping_) {
      say("elastic: cannot count rank " + std::to_string(children_[index].rank) +
          " out: " + n.status().message());
    }
  }
  last_end_ = failed ? code : 0;
  if (failed) last_loss_ = code;
  if (stopping_) return;
  if (failed) {
    const int left = running_count();
    say("rank " + std::to_string(children_[index].rank) + " " + what + "; it leaves the job, " +
        others(left) + (left == 1 ? " goes" : " go") + " on here (elastic)");
  }
  claim_pending(true);
}

void Launcher::hosts_change(const Membership& m) {
  reap();
  if (stopping_ || m.version <= version_) return;
  const int64_t seen = version_;
  const int64_t old = cluster_size_;
  version_ = m.version;
  cluster_size_ = m.size;
  pending_.clear();
  const std::string head = "membership version " + std::to_string(m.version) + " has " +
                           others(static_cast<int>(std::min<int64_t>(m.size, 1 << 30)));
  if (m.size < opts_.min_np) {
    say(head + ", below --min-np " + std::to_string(opts_.min_np) + "; stopping " +
        others(running_count()) + " here");
    exit_code_ = last_loss_.value_or(1);
    stop(SIGTERM);
    return;
  }
  if (m.size <= old) {
    say(head + " (was " + std::to_string(old) + ")");
    return;
  }
  const std::string ranks = std::to_string(old) + ".." + std::to_string(m.size - 1);
  if (m.version > seen + 1) {
    // A grow always follows the membership just before it: this launcher missed versions
    // (a lost store connection), so it does not know where the new ranks begin, and
    // claiming from an older size could start a rank twice.
    say(head + "; version " + std::to_string(m.version - 1) + " was not seen here, so the ranks "
        "it adds are unknown: claiming none");
    return;
  }
  if (m.size > opts_.max_np) {
    say(head + ", above --max-np " + std::to_string(opts_.max_np) + "; not starting ranks " +
        ranks);
    return;
  }
  for (int64_t r = old; r < m.size; ++r) pending_.push_back(static_cast<int>(r));
  pending_until_ = Clock::now() + kClaimWindow;
  say(head + "; ranks " + ranks + " join");
  claim_pending(false);
}

void Launcher::claim_pending(bool retry) {
  if (pending_.empty() || !claims_ || stopping_ || Clock::now() >= pending_until_) return;
  std::map<std::string, std::string> vars = vars_;
  vars["TAIJI_WORLD_SIZE"] = std::to_string(cluster_size_);
  vars["TAIJI_CLUSTER_VERSION"] = std::to_string(version_);
  std::vector<int> here, left;
  std::map<std::string, std::vector<int>> elsewhere;
  size_t i = 0;
  for (; i < pending_.size(); ++i) {
    const int slot = free_slot();
    if (slot < 0) break;
    const int r = pending_[i];
    auto holder = claims_->claim(version_, r, opts_.self);
    if (!holder.is_ok()) {
      say("elastic: cannot claim rank " + std::to_string(r) + ": " + holder.status().message());
      break;
    }
    if (holder.value() != opts_.self) {
      elsewhere[holder.value()].push_back(r);
      continue;
    }
    if (!spawn(r, slot, slots_, path_, vars)) {
      say("cannot start rank " + std::to_string(r) + ": " + std::strerror(errno) +
          "; the job goes on without it");
      ++i;
      break;
    }
    here.push_back(r);
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(i));
  std::string text;
  if (!here.empty()) text += "; starting rank " + rank_list(here) + " here";
  for (const auto& [host, ranks] : elsewhere) text += "; rank " + rank_list(ranks) + " on " + host;
  if (!pending_.empty() && !retry && free_slot() < 0) {
    text += "; no free slot here for rank " + rank_list(pending_) + " (" +
            std::to_string(slots_) + " in use)";
  }
  if (!text.empty()) {
    say("membership version " + std::to_string(version_) + (retry ? " (a slot came free)" : "") + ": " +
        text.substr(2));
  }
}

bool Launcher::job_goes_on() {
  if (!across_hosts() || stopping_ || !claims_) return false;
  const auto now = Clock::now();
  if (next_count_check_ && now < *next_count_check_) return true;
  next_count_check_ = now + kCountPoll;
  auto n = claims_->running();
  if (!n.is_ok()) {
    say("elastic: cannot read the job's process count: " + n.status().message() + "; exiting");
    return false;
  }
  if (n.value() && *n.value() <= 0) return false;
  if (!said_waiting_) {
    const std::string state = children_.empty() ? "no rank runs here yet; " : "no rank runs here now; ";
    say(state + (n.value() ? "staying while " + others(static_cast<int>(*n.value())) +
                                 " run on other hosts"
                           : "waiting for the job's first ranks on other hosts"));
    said_waiting_ = true;
  }
  return true;
}

}  // namespace taiji_run
