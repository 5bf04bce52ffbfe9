// The stall watchdog's protocol: an op still running long after it was posted asks every
// rank whether it has posted it (a Query under the op's name and version), every peer
// answers (an Answer, chunk = 1 when posted), and once every answer is in the watchdog
// logs the ranks that have not posted it, or, when all have, the ranks the op still waits
// on for data. A service of the router; the op engine decides when to ask. The answers
// also tell a timeout whom to name: a rank that never answers is stopped, hung or cut off,
// where the neighbour the op waits on for data may only be waiting itself.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/name_table.h"
#include "runtime/router.h"

namespace taiji {

// "0 2 5": ranks as the watchdog's reports and the engine's timeout messages list them.
std::string rank_list(const std::vector<int>& ranks);

struct StallOptions {
  int rank = 0;
  int size = 1;
  // Whether a reserved (name, version) is still held in a caller's open group: it counts
  // as not posted when asked. Unset: nothing is held.
  std::function<bool(const std::string&, uint64_t)> held;
};

class StallWatchdog final : public ReceiveHandler {
 public:
  using Key = std::pair<std::string, uint64_t>;
  // What the report says of the op asked about.
  struct OpState {
    std::string title;
    uint64_t age_ms = 0;
    std::vector<int> waiting_on;  // ranks whose data it still waits for
  };
  // Fills *out for the op under key while it runs and has not failed; false otherwise
  // (its answers are then ignored).
  using Lookup = std::function<bool(const Key&, OpState* out)>;

  StallWatchdog(StallOptions options, NameTable* names, Lookup lookup);
  void set_transport(Transport* transport) { transport_ = transport; }
  // Registers Query and Answer (every name without a service of its own).
  void serve(Router& router);

  // Asks every other rank about the op under key; query is the op's header for a Query.
  // Ranks in `departed` (they finalized) count as not posted without being asked.
  // report: log what the answers say once all are in (a stall warning); else only keep
  // them for the op's timeout message. only >= 0: the one other rank taking part (a send
  // or recv); the rest are not asked.
  void ask(const Key& key, const FrameHeader& query, const std::vector<bool>& departed,
           bool report = true, int only = -1);
  // Ranks that answered that they had not posted key when asked.
  std::vector<int> unposted(const Key& key) const;
  // Ranks asked about key that have not answered.
  std::vector<int> unanswered(const Key& key) const;
  // The op ended: its answers, if any still come, are ignored.
  void forget(const Key& key) { asked_.erase(key); }

  Status accept_frame(int src, const FrameHeader& h, const std::string& name,
                      const uint8_t* in_memory, uint8_t** target) override;
  void frame_done(int src, const FrameHeader& h, const std::string& name) override;
  void link_down(int, bool, const Status&) override {}

 private:
  void answer(int src, const FrameHeader& h, const std::string& name);
  void on_answer(const Key& key, int src, bool posted);

  StallOptions opt_;
  NameTable* names_;
  Lookup lookup_;
  Transport* transport_ = nullptr;
  struct Asked {
    std::vector<int8_t> posted_at;  // per rank: -1 no answer yet, 0 not posted, 1 posted
    bool report = true;
  };
  std::vector<int> ranks_answering(const Key& key, int8_t answer) const;
  std::map<Key, Asked> asked_;
};

}  // namespace taiji
