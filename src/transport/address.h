// "host:port" addresses, as peers publish and dial them and as users configure them.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace taiji {

// The reason `s` is not "host:port" (or "[v6]:port"), or an empty string when it is, and
// then *host and *port are set.
std::string split_host_port(const std::string& s, bool allow_zero, std::string* host,
                            uint16_t* port);

// Splits "host:port" ("[v6]:port" too); port must be 1..65535 (0 allowed if allow_zero).
// Errors are InvalidArgument quoting the input and saying what is wrong with it.
Status parse_host_port(const std::string& s, std::string* host, uint16_t* port,
                       bool allow_zero = false);

}  // namespace taiji
