#include "runtime/elastic.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bootstrap/store_open.h"
#include "common/time_limit.h"
#include "monitor/log.h"
#include "runtime/elastic_keys.h"
#include "runtime/internal_gather.h"
#include "topology/selection.h"
#include "topology/text.h"

namespace taiji {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kResizeOpName = "taiji.resize";
// How long requested_size waits for the store.
constexpr int64_t kRequestReadMs = 1000;
// A shrink re-checks the ranks lost on its own links at least this often while it waits
// for the store to change.
constexpr int64_t kShrinkPollMs = 20;

Clock::time_point deadline_of(const Peer& peer, int64_t timeout_ms) {
  const int64_t budget = clamp_timeout_ms(timeout_ms == 0 ? peer.config().init_timeout_ms : timeout_ms);
  return Clock::now() + std::chrono::milliseconds(budget);
}

Status check_caller(const Peer& peer, const char* what, int64_t timeout_ms) {
  if (peer.on_io_thread()) {
    return {Code::InvalidArgument, std::string(what) + " blocks; it cannot run from a completion callback"};
  }
  if (peer.in_group()) {
    return {Code::InvalidArgument, std::string(what) + " blocks; it cannot run inside an open group"};
  }
  if (timeout_ms < 0) return {Code::InvalidArgument, std::string(what) + ": timeout_ms is negative"};
  return {};
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// A shrink round's record: "open R..." or "closed T R...".
struct ShrinkRecord {
  bool closed = false;
  uint32_t target = 0;
  std::vector<int> ranks;
};

bool parse_record(const std::string& text, ShrinkRecord* out) {
  std::istringstream in(text);
  std::string state;
  in >> state;
  if (state != "open" && state != "closed") return false;
  out->closed = state == "closed";
  if (out->closed && !(in >> out->target)) return false;
  int r;
  while (in >> r) out->ranks.push_back(r);
  return in.eof();
}

std::string format_record(const ShrinkRecord& rec) {
  std::string out = rec.closed ? "closed " + std::to_string(rec.target) : "open";
  for (int r : rec.ranks) out += " " + std::to_string(r);
  return out;
}

bool is_connection_failure(const Status& s) {
  return s.code() == Code::Bootstrap || s.code() == Code::Io;
}

}  // namespace

template <typename Fn>
auto Elastic::with_store(const Config& config, int64_t timeout_ms, Fn&& fn)
    -> decltype(fn(std::declval<Store&>())) {
  if (config.rendezvous.empty()) {
    return Status{Code::InvalidArgument, "this job has no rendezvous store (a job of one started "
                                         "without taiji-run): elastic calls need one"};
  }
  std::lock_guard<std::mutex> lock(store_mu_);
  for (int attempt = 0;; ++attempt) {
    if (!store_) {
      auto opened = open_store(config.rendezvous, timeout_ms);
      if (!opened.is_ok()) return opened.status();
      store_ = std::move(opened.value());
    }
    auto result = fn(*store_);
    // An idle connection to the embedded store is closed after a while: one fresh try.
    if (result.is_ok() || attempt > 0 || !is_connection_failure(result.status())) return result;
    store_.reset();
  }
}

void Elastic::announce(const Config& config, uint32_t version, int size, int64_t timeout_ms) {
  auto said = with_store(config, timeout_ms, [&](Store& s) -> Result<bool> {
    Status st = s.set(elastic_cluster_key(config.job_id),
                      std::to_string(version) + " " + std::to_string(size), timeout_ms);
    if (!st.is_ok()) return st;
    return true;
  });
  if (!said.is_ok()) {
    log().warn("cannot announce membership {} ({} ranks) to the launchers: {}", version, size,
               said.status().message());
  }
}

Status Elastic::replace(std::unique_ptr<Peer>* slot, int rank, int size, uint32_t version,
                        int64_t timeout_ms) {
  Peer& old = **slot;
  tried_version_ = std::max(tried_version_, version);
  auto server = old.release_services();
  Config c = old.config();
  c.rank = rank;
  c.size = size;
  c.cluster_version = version;
  c.host_rendezvous = 0;  // the old peer's server, if it had one, moves over
  c.init_timeout_ms = std::max<int64_t>(timeout_ms, 1);
  // An explicit graph is one of the old size; a built-in name fits any size.
  if (strategy_id(topology_text_body(c.topology)) == 0) c.topology.clear();
  std::unique_ptr<RendezvousServer> server_back;
  auto made = Peer::create(c, std::move(server), &server_back);
  if (!made.is_ok()) {
    old.keep_server(std::move(server_back));
    Status why{made.status().code(), "the membership of version " + std::to_string(version) + " (" +
                                         std::to_string(size) + " ranks) did not start: " +
                                         made.status().message()};
    old.fail(why);
    return why;
  }
  *slot = std::move(made.value());
  return {};
}

Result<ResizeOutcome> Elastic::resize(std::unique_ptr<Peer>* slot, int new_size, int64_t timeout_ms) {
  Peer& old = **slot;
  if (Status s = check_caller(old, "resize", timeout_ms); !s.is_ok()) return s;
  if (new_size < 1) return Status{Code::InvalidArgument, "resize: new_size must be at least 1"};
  const auto deadline = deadline_of(old, timeout_ms);
  const int size = old.size();
  const int me = old.rank();

  // 1. Every member's proposal; any disagreement changes nothing anywhere.
  auto mine = std::make_shared<std::vector<uint8_t>>(sizeof(int32_t));
  auto all = std::make_shared<std::vector<uint8_t>>(sizeof(int32_t) * static_cast<size_t>(size));
  const int32_t proposal = new_size;
  std::memcpy(mine->data(), &proposal, sizeof(proposal));
  if (Status s = internal_gather(old, "resize", kResizeOpName, 0, mine, all, DType::I32, 1, deadline, nullptr);
      !s.is_ok()) {
    return s;
  }
  std::vector<int32_t> proposals(static_cast<size_t>(size));
  std::memcpy(proposals.data(), all->data(), all->size());
  if (std::any_of(proposals.begin(), proposals.end(), [&](int32_t p) { return p != proposal; })) {
    std::string text;
    for (int r = 0; r < size; ++r) {
      text += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + ": " + std::to_string(proposals[r]);
    }
    return Status{Code::Mismatch, "resize: the members proposed different sizes (" + text + ")"};
  }
  if (new_size == size) return ResizeOutcome{};

  // 2. The next membership: announced first, so that a launcher starts the joiners while
  // the old links close.
  // Past any version a failed change already published addresses under.
  const uint32_t next = std::max(old.cluster_version(), tried_version_) + 1;
  const Config config = old.config();
  if (me == 0) {
    announce(config, next, new_size, left_ms(deadline));
    // The request is served (an operator's newer one is left for the next resize). Cleared
    // before rank 0 joins the new membership, so no member returns from the resize while
    // the store still asks for this size.
    (void)with_store(config, left_ms(deadline), [&](Store& s) {
      return s.compare_and_set(elastic_request_key(config.job_id), std::to_string(new_size), "0",
                               std::max<int64_t>(left_ms(deadline), 1));
    });
  }
  log().debug("rank {} of {}: resize to {} (cluster version {})", me, size, new_size, next);
  // Ops every member posted before the resize finish; the rest fail, naming it.
  old.finalize_within(std::min<int64_t>(left_ms(deadline) / 2, config.timeout_ms));
  old.forget_departures();
  if (me >= new_size) {
    old.release_services();
    return ResizeOutcome{true, true};
  }
  if (Status s = replace(slot, me, new_size, next, left_ms(deadline)); !s.is_ok()) {
    return Status{s.code(), "resize: " + s.message()};
  }
  return ResizeOutcome{true, false};
}

Result<bool> Elastic::shrink(std::unique_ptr<Peer>* slot, int64_t timeout_ms) {
  Peer& old = **slot;
  if (Status s = check_caller(old, "shrink", timeout_ms); !s.is_ok()) return s;
  const auto deadline = deadline_of(old, timeout_ms);
  const int size = old.size();
  const int me = old.rank();
  const uint32_t version = old.cluster_version();
  const Config config = old.config();
  if (shrink_version_ != version) {
    shrink_version_ = version;
    shrink_round_ = 0;
  }
  const uint32_t round = shrink_round_++;
  const std::string key = elastic_shrink_key(config.job_id, version, round);
  auto ms = [&] { return std::max<int64_t>(left_ms(deadline), 1); };

  // 1. Join the round: add this rank to the open record (or find it closed already).
  auto joined = with_store(config, ms(), [&](Store& store) -> Result<std::string> {
    std::optional<std::string> expected;
    for (;;) {
      ShrinkRecord rec;
      if (expected && (!parse_record(*expected, &rec))) {
        return Status{Code::Protocol, "shrink: the store's record '" + key + "' is not one: " + *expected};
      }
      if (rec.closed || std::count(rec.ranks.begin(), rec.ranks.end(), me)) return *expected;
      rec.ranks.push_back(me);
      auto cas = store.compare_and_set(key, expected, format_record(rec), ms());
      if (!cas.is_ok()) return cas.status();
      if (cas.value().swapped) return format_record(rec);
      expected = cas.value().current;
      if (!expected) return Status{Code::Protocol, "shrink: the store's record '" + key + "' was deleted"};
    }
  });
  if (!joined.is_ok()) {
    return Status{joined.status().code(), "shrink: cannot reach the rendezvous store: " + joined.status().message()};
  }

  // 2. Wait until every old rank has joined or has left (lost on this peer's links, or
  // finalized); then close
  // the record (whoever gets there first) with the members in their old order.
  std::string value = joined.value();
  ShrinkRecord rec;
  for (;;) {
    rec = {};
    if (!parse_record(value, &rec)) return Status{Code::Protocol, "shrink: bad record '" + value + "'"};
    if (rec.closed) break;
    const std::set<int> lost = old.gone_ranks();
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!lost.count(r) && !std::count(rec.ranks.begin(), rec.ranks.end(), r)) missing.push_back(r);
    }
    if (missing.empty()) {
      ShrinkRecord closed = rec;
      closed.closed = true;
      closed.target = std::max(version + 1 + round, tried_version_ + 1);
      std::sort(closed.ranks.begin(), closed.ranks.end());
      auto cas = with_store(config, ms(), [&](Store& s) {
        return s.compare_and_set(key, value, format_record(closed), ms());
      });
      if (!cas.is_ok()) return Status{cas.status().code(), "shrink: " + cas.status().message()};
      if (!cas.value().current) return Status{Code::Protocol, "shrink: the store's record '" + key + "' was deleted"};
      value = *cas.value().current;
      continue;
    }
    if (left_ms(deadline) == 0) {
      return Status{Code::Timeout, "shrink: rank(s) " + join_ranks(missing) +
                                       " neither joined the shrink nor left (lost or finalized) in time"};
    }
    auto changed = with_store(config, ms(), [&](Store& s) {
      return s.watch(key, value, std::min<int64_t>(kShrinkPollMs, ms()));
    });
    if (changed.is_ok()) {
      if (!changed.value()) return Status{Code::Protocol, "shrink: the store's record '" + key + "' was deleted"};
      value = *changed.value();
    } else if (changed.status().code() != Code::Timeout) {
      return Status{changed.status().code(), "shrink: " + changed.status().message()};
    }
  }
  const auto at = std::find(rec.ranks.begin(), rec.ranks.end(), me);
  if (at == rec.ranks.end()) {
    return Status{Code::Bootstrap, "shrink: the other survivors (old ranks " + join_ranks(rec.ranks) +
                                       ") went on without this rank: they lost their links to it"};
  }
  // Nobody lost: nothing to do, unless a failed resize left this peer unusable; then the
  // same members start again at a new version.
  if (static_cast<int>(rec.ranks.size()) == size && old.usable()) return false;

  // 3. The survivors' membership: ranks by old order.
  const int new_rank = static_cast<int>(at - rec.ranks.begin());
  const int new_size = static_cast<int>(rec.ranks.size());
  log().info("rank {} of {}: continuing as rank {} of {} (cluster version {}) without rank(s) {}", me, size,
             new_rank, new_size, rec.target, join_ranks([&] {
               std::vector<int> gone;
               for (int r = 0; r < size; ++r) {
                 if (!std::count(rec.ranks.begin(), rec.ranks.end(), r)) gone.push_back(r);
               }
               return gone;
             }()));
  if (new_rank == 0) announce(config, rec.target, new_size, ms());
  old.abort();
  old.finalize_within(0);
  if (Status s = replace(slot, new_rank, new_size, rec.target, left_ms(deadline)); !s.is_ok()) {
    return Status{s.code(), "shrink: " + s.message()};
  }
  return true;
}

int Elastic::requested_size(const Peer& peer) {
  const Config& config = peer.config();
  if (config.rendezvous.empty()) return 0;
  auto n = with_store(config, kRequestReadMs, [&](Store& s) {
    return s.add(elastic_request_key(config.job_id), 0, kRequestReadMs);
  });
  if (!n.is_ok() || n.value() < 0 || n.value() > INT32_MAX) return 0;
  return static_cast<int>(n.value());
}

}  // namespace taiji
