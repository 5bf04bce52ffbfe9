#include "runtime/internal_gather.h"

#include <algorithm>
#include <string>

#include "runtime/peer.h"

namespace taiji {

namespace {

// The op deadline ends every gather; this only guards against a loop that stopped.
constexpr int64_t kWaitGraceMs = 1000;

}  // namespace

int64_t left_ms(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::max<int64_t>(left.count(), 0);
}

Status internal_gather(Peer& peer, const char* what, const char* name, uint64_t version,
                       std::shared_ptr<std::vector<uint8_t>> send,
                       std::shared_ptr<std::vector<uint8_t>> recv, DType dtype, uint64_t count,
                       std::chrono::steady_clock::time_point deadline, uint64_t* version_out) {
  const int64_t timeout_ms = left_ms(deadline);
  if (timeout_ms == 0) return {Code::Timeout, std::string(what) + ": no time left for " + name};
  PostArgs args;
  args.kind = OpKind::Allgather;
  args.name = name;
  args.version = version;
  args.send = send->data();
  args.recv = recv->data();
  args.count = count;
  args.dtype = dtype;
  args.timeout_ms = timeout_ms;
  args.callback = [send, recv](const Status&) {};
  auto posted = peer.post_internal(std::move(args), false);
  if (!posted.is_ok()) return {posted.status().code(), std::string(what) + ": " + posted.status().message()};
  Status result;
  if (!posted.value()->wait_for(timeout_ms + kWaitGraceMs, &result)) {
    return {Code::Timeout, std::string(what) + ": " + name + " did not complete on the I/O thread"};
  }
  if (!result.is_ok()) return {result.code(), std::string(what) + ": " + result.message()};
  if (version_out != nullptr) *version_out = posted.value()->version();
  return {};
}

}  // namespace taiji
