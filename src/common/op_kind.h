// The collective vocabulary: what kinds of op exist and what their frames carry. One list,
// so the wire format, the engine's messages and the metrics' labels cannot drift apart.
#pragma once

#include <cstdint>

namespace taiji {

// X(Enum, wire value, label, carries a reduction operator, has a root). Wire values are
// fixed: a peer of another build decodes them.
#define TAIJI_OP_KIND_LIST(X)                             \
  X(None, 0, "none", false, false)                        \
  X(Allreduce, 1, "allreduce", true, false)               \
  X(Broadcast, 2, "broadcast", false, true)               \
  X(Barrier, 3, "barrier", false, false)                  \
  X(Allgather, 4, "allgather", false, false)              \
  X(Reduce, 5, "reduce", true, true)                      \
  X(Gather, 6, "gather", false, true)                     \
  X(ReduceScatter, 7, "reduce_scatter", true, false)      \
  X(Consensus, 8, "consensus", false, false)              \
  X(Send, 9, "send", false, false)                        \
  X(Recv, 10, "recv", false, false)

enum class OpKind : uint8_t {
#define TAIJI_OP_KIND_ENUM_(kind, value, label, reduces, rooted) kind = value,
  TAIJI_OP_KIND_LIST(TAIJI_OP_KIND_ENUM_)
#undef TAIJI_OP_KIND_ENUM_
};

#define TAIJI_OP_KIND_COUNT_(kind, value, label, reduces, rooted) +1
constexpr int kOpKindCount = 0 TAIJI_OP_KIND_LIST(TAIJI_OP_KIND_COUNT_);
#undef TAIJI_OP_KIND_COUNT_
// Values run 0 .. kMaxOpKind without gaps, so a value can index a table of kinds.
constexpr uint8_t kMaxOpKind = kOpKindCount - 1;

// "allreduce", "reduce_scatter", ...; "none" for None and values off the list.
constexpr const char* op_kind_name(OpKind k) {
  switch (k) {
#define TAIJI_OP_KIND_NAME_(kind, value, label, reduces, rooted) \
  case OpKind::kind:                                              \
    return label;
    TAIJI_OP_KIND_LIST(TAIJI_OP_KIND_NAME_)
#undef TAIJI_OP_KIND_NAME_
  }
  return "none";
}

// Kinds whose frames carry a reduction operator, and kinds that have a root.
constexpr bool op_kind_reduces(OpKind k) {
  switch (k) {
#define TAIJI_OP_KIND_REDUCES_(kind, value, label, reduces, rooted) \
  case OpKind::kind:                                                 \
    return reduces;
    TAIJI_OP_KIND_LIST(TAIJI_OP_KIND_REDUCES_)
#undef TAIJI_OP_KIND_REDUCES_
  }
  return false;
}
constexpr bool op_kind_rooted(OpKind k) {
  switch (k) {
#define TAIJI_OP_KIND_ROOTED_(kind, value, label, reduces, rooted) \
  case OpKind::kind:                                                \
    return rooted;
    TAIJI_OP_KIND_LIST(TAIJI_OP_KIND_ROOTED_)
#undef TAIJI_OP_KIND_ROOTED_
  }
  return false;
}

// Point-to-point: one sender and one receiver, each posting its own side of the op.
constexpr bool op_kind_p2p(OpKind k) { return k == OpKind::Send || k == OpKind::Recv; }
// The kind the other side of an op posts, which its frames carry: the two halves of a
// point-to-point op meet each other; a collective meets itself.
constexpr OpKind op_kind_partner(OpKind k) {
  return k == OpKind::Send ? OpKind::Recv : k == OpKind::Recv ? OpKind::Send : k;
}

// The two stages of a chunk's trip: up the reduce tree, down the broadcast tree.
enum class Stage : uint8_t { Reduce = 0, Broadcast = 1 };

}  // namespace taiji
