// The engine's name for a point-to-point op. Ops meet by (name, version); a send and its
// recv must meet each other and nothing else, so both sides file the op under a name made
// of the caller's name and the pair: "taiji.p2p/<src>><dst>/<name>". The reserved prefix
// keeps it apart from every collective's name, the pair from other pairs' and the other
// direction's ops; and the automatic version, counted per such name, is per (name,
// direction, other rank) as the header promises.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace taiji {

// The most bytes a key adds to the caller's name (two ranks of up to 10 digits): the
// frames' name cap is raised by this much, so a name the collectives take fits here too.
constexpr size_t kP2pKeyOverhead = 32;

std::string p2p_key(std::string_view name, int src, int dst);
// The caller's name inside a key; any other name as it is.
std::string_view p2p_user_name(std::string_view key);

}  // namespace taiji
