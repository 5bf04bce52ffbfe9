// The allreduce the fake-member wire tests run against rank 0: two f32 summed, named "w",
// rank 0's input kMine and rank 1's kTheirs.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fake_member.h"
#include "runtime/peer.h"

namespace wire {

inline constexpr const char* kOp = "w";
inline constexpr std::array<float, 2> kMine = {1.5f, 2.5f};
inline constexpr std::array<float, 2> kTheirs = {10.25f, -4.0f};
inline constexpr int64_t kBoundMs = 10000;

std::vector<uint8_t> bytes_of(const float* v, size_t n);
// Rank 1's input as a Data payload.
std::vector<uint8_t> theirs();

// Posts "w" on rank 0 (input kMine into *out) and reads the Ready it sends rank 1.
// Empty on success, else why not.
std::string post_op(taiji::Peer& victim, FakeMember& fake, std::array<float, 2>* out,
                    std::shared_ptr<taiji::RequestState>* request, Frame* ready);

// Posts "w" on rank 0, lets `deliver` send rank 1's frames for it, and checks that the op
// ends well within kBoundMs with the exact sum in *out. Empty on success, else why not.
std::string allreduce_checked(taiji::Peer& victim, FakeMember& fake, std::array<float, 2>* out,
                              const std::function<void(const Frame& ready)>& deliver,
                              std::shared_ptr<taiji::RequestState>* request);

}  // namespace wire
