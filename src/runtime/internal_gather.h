// A blocking allgather of the runtime's own (names under "taiji."), for the calls that
// agree on something over a peer's links before they act: split, resize.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace taiji {

class Peer;

// Milliseconds left before the deadline; 0 once it passed.
int64_t left_ms(std::chrono::steady_clock::time_point deadline);

// Posts an allgather of `count` elements per rank under `name` (version 0: the next
// automatic one) and waits for it until the deadline. The buffers are shared with the op's
// callback, so that they outlive the op whatever happens here. `what` ("split") starts
// every error's text. *version_out (may be null) gets the version the op ran as.
Status internal_gather(Peer& peer, const char* what, const char* name, uint64_t version,
                       std::shared_ptr<std::vector<uint8_t>> send,
                       std::shared_ptr<std::vector<uint8_t>> recv, DType dtype, uint64_t count,
                       std::chrono::steady_clock::time_point deadline, uint64_t* version_out);

}  // namespace taiji
