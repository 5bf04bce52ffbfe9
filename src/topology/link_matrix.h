// What was measured of the network between every pair of ranks: one directed entry per
// (src, dst), because links need not be symmetric (a throttled direction, an asymmetric
// uplink). Every rank holds the same matrix once it is gathered, so anything computed from
// it is the same on every rank.
#pragma once

#include <cstddef>
#include <vector>

namespace taiji {

struct LinkMatrix {
  int n = 0;
  // Row-major, n*n each. bandwidth: bytes per second from src to dst, latency: seconds for
  // one small message from src to dst (half a round trip). The diagonal is 0; an entry of
  // 0 off the diagonal is unknown (not measured), which the optimiser treats as the
  // slowest link of the matrix.
  std::vector<double> bandwidth;
  std::vector<double> latency;

  static LinkMatrix sized(int ranks) {
    LinkMatrix m;
    m.n = ranks;
    m.bandwidth.assign(static_cast<size_t>(ranks) * static_cast<size_t>(ranks), 0.0);
    m.latency.assign(m.bandwidth.size(), 0.0);
    return m;
  }
  double bw(int src, int dst) const { return bandwidth[index(src, dst)]; }
  double lat(int src, int dst) const { return latency[index(src, dst)]; }
  size_t index(int src, int dst) const {
    return static_cast<size_t>(src) * static_cast<size_t>(n) + static_cast<size_t>(dst);
  }
};

}  // namespace taiji
