// Orders device ops that ranks post in any order. NCCL needs every rank to launch the same
// collectives in the same order; taiji lets ranks post named ops in any order. Each rank
// announces the ops it has posted to the coordinator (rank 0) over taiji's own links; once
// every rank has announced an op, the coordinator checks that all agree on its spec and
// puts it in the next batch; every rank receives the same batches in the same order and
// launches each as one NCCL group. A steady-state cache (Horovod's response cache, in
// spirit) gives each agreed (name, spec) a small id, so a repeated op is announced and
// ordered by id and version alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/op_kind.h"
#include "common/status.h"

namespace taiji {

// What every rank must agree on for one op.
struct DeviceOpSpec {
  OpKind kind = OpKind::Allreduce;
  DType dtype = DType::F32;
  RedOp redop = RedOp::Sum;
  uint64_t count = 0;
  int root = 0;
  bool operator==(const DeviceOpSpec&) const = default;
};

// "allreduce f32 sum count 1024" (root for rooted kinds): for mismatch messages.
std::string describe(const DeviceOpSpec& spec);

struct OrderEntry {
  enum class Verdict : uint8_t {
    Run,       // in this batch: launch it
    Mismatch,  // ranks disagree on its spec: fail it with Mismatch and `why`
    Withdrawn  // a rank withdrew it before every rank had announced it: fail it with Timeout and `why`
  };
  std::string name;
  uint64_t version = 0;
  Verdict verdict = Verdict::Run;
  std::string why;  // Mismatch: which ranks differ and how; Withdrawn: which rank withdrew
};

// Every rank's side: encodes its announcements and withdrawals, reads the coordinator's
// orders, and keeps the cache of agreed ids. Not thread-safe: the I/O thread owns it.
class SequencerClient {
 public:
  // Appends to `msg` the announcement of one posted op: by cached id when (name, spec) has
  // one, else in full. Several may be appended to one message.
  void announce(const std::string& name, uint64_t version, const DeviceOpSpec& spec, std::vector<uint8_t>& msg);
  // Appends a withdrawal: this rank's op timed out before it was ordered. The coordinator
  // answers with a Withdrawn entry (the op fails everywhere it was announced) unless it
  // had ordered it already (the order arrives first, and the op runs).
  void withdraw(const std::string& name, uint64_t version, std::vector<uint8_t>& msg);
  // Decodes one order message (the same bytes reach every rank): one batch, in order.
  // Learns the ids it assigns. Protocol error on malformed bytes.
  Result<std::vector<OrderEntry>> read_order(const uint8_t* data, size_t size);

 private:
  // Keyed by the (name, spec) pair's wire bytes: DeviceOpSpec has no order or hash.
  std::unordered_map<std::string, uint32_t> ids_;    // filled by read_order
  std::unordered_map<uint32_t, std::string> names_;  // id -> name
  friend struct SequencerClientAccess;
};

// The coordinator, on rank 0 only (its own announcements go through receive() too).
class Sequencer {
 public:
  explicit Sequencer(int size);
  // One message from `rank` (announcements and withdrawals, in the order it wrote them).
  // Protocol error on malformed bytes or an unknown id; nothing of a bad message is kept.
  Status receive(int rank, const uint8_t* data, size_t size);
  // The next batch, as the message to send to every rank (rank 0 included); empty when no
  // op has become complete, mismatched or withdrawn since the last call. Within a batch,
  // ops are in the order they became complete.
  std::vector<uint8_t> take_order();
  // Ops announced by some rank but not yet ordered (for stall reports and tests).
  size_t pending() const;
  // Ids assigned so far (the cache's size).
  size_t cached() const;

 private:
  using Key = std::pair<std::string, uint64_t>;  // (name, version)
  // Ranks usually agree, so an op keeps the first announcer's spec and only the ranks whose
  // spec differs from it, not one spec per rank.
  struct Pending {
    std::vector<bool> posted;  // by rank
    int count = 0;
    DeviceOpSpec spec;
    std::vector<std::pair<int, DeviceOpSpec>> differ;
  };
  struct Def {
    std::string name;
    DeviceOpSpec spec;
  };

  void announced(int rank, const std::string& name, uint64_t version, const DeviceOpSpec& spec);
  void withdrawn(int rank, const std::string& name, uint64_t version);
  void decide(const Key& key, const Pending& p);
  void emit_run(const Key& key, const DeviceOpSpec& spec);
  void emit_failed(uint8_t tag, const Key& key, const std::string& why);
  void remember_withdrawn(const Key& key, int rank);

  int size_;
  std::map<Key, Pending> pending_;
  std::vector<Def> defs_;                          // id -> (name, spec)
  std::unordered_map<std::string, uint32_t> ids_;  // (name, spec) wire bytes -> id
  // Recently withdrawn ops -> the rank that withdrew them, so that the announcements still
  // on their way do not start them again; bounded, oldest forgotten first.
  std::map<Key, int> withdrawn_;
  std::deque<Key> withdrawn_order_;
  std::vector<uint8_t> out_;  // the next order message, built as entries are decided
};

}  // namespace taiji
