// A fixed log-scale latency histogram: bucket i counts durations up to 2^i microseconds
// (1 us .. 2^27 us, about 134 s), the last bucket everything longer. Adding is a few
// integer operations and never allocates; not thread-safe (its owner holds a lock).
#pragma once

#include <array>
#include <bit>
#include <cstdint>

namespace taiji {

class LatencyHistogram {
 public:
  static constexpr int kFinite = 28;          // buckets with an upper bound
  static constexpr int kBuckets = kFinite + 1;  // plus the overflow bucket

  // Upper bound of bucket i in seconds (i < kFinite).
  static double bound_seconds(int i) { return static_cast<double>(uint64_t{1} << i) * 1e-6; }

  static int bucket_of(uint64_t ns) {
    const uint64_t us = (ns + 999) / 1000;  // rounded up: a bucket's bound is inclusive
    if (us <= 1) return 0;
    const int i = 64 - std::countl_zero(us - 1);
    return i < kFinite ? i : kFinite;
  }

  void add(uint64_t ns) {
    counts_[static_cast<size_t>(bucket_of(ns))]++;
    count_++;
    sum_ns_ += ns;
    if (ns > max_ns_) max_ns_ = ns;
  }

  uint64_t count() const { return count_; }
  uint64_t bucket(int i) const { return counts_[static_cast<size_t>(i)]; }
  double sum_seconds() const { return static_cast<double>(sum_ns_) * 1e-9; }
  double max_seconds() const { return static_cast<double>(max_ns_) * 1e-9; }

  // The q-quantile (0 < q <= 1) estimated like Prometheus' histogram_quantile: linear
  // within the bucket that holds it; the overflow bucket reports the largest value seen.
  double quantile(double q) const {
    if (count_ == 0) return 0;
    const double rank = q * static_cast<double>(count_);
    uint64_t below = 0;
    for (int i = 0; i < kBuckets; ++i) {
      const uint64_t c = counts_[static_cast<size_t>(i)];
      if (c > 0 && static_cast<double>(below + c) >= rank) {
        if (i == kFinite) return max_seconds();
        const double lo = i == 0 ? 0 : bound_seconds(i - 1);
        const double hi = bound_seconds(i);
        const double v = lo + (hi - lo) * (rank - static_cast<double>(below)) / static_cast<double>(c);
        return v < max_seconds() ? v : max_seconds();
      }
      below += c;
    }
    return max_seconds();
  }

 private:
  std::array<uint64_t, kBuckets> counts_{};
  uint64_t count_ = 0;
  uint64_t sum_ns_ = 0;
  uint64_t max_ns_ = 0;
};

}  // namespace taiji
