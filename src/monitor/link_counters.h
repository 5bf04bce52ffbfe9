// Bytes moved on each link, counted by the transport on the I/O thread and read by any
// thread taking a snapshot. Relaxed atomics: totals only, no ordering with anything else.
#pragma once

#include <atomic>
#include <cstdint>

namespace taiji {

struct LinkCounters {
  std::atomic<uint64_t> sent{0};      // frame bytes handed to the link (header, name, payload)
  std::atomic<uint64_t> received{0};  // bytes read from the link
  // Of sent, what went through shared memory (ring payloads and mailbox frames).
  std::atomic<uint64_t> shm_sent{0};
  // Times reads from the link paused because the early-arrival buffer was full.
  std::atomic<uint64_t> read_pauses{0};

  void add_sent(uint64_t n) { sent.fetch_add(n, std::memory_order_relaxed); }
  void add_shm_sent(uint64_t n) {
    sent.fetch_add(n, std::memory_order_relaxed);
    shm_sent.fetch_add(n, std::memory_order_relaxed);
  }
  void add_received(uint64_t n) { received.fetch_add(n, std::memory_order_relaxed); }
  void add_read_pause() { read_pauses.fetch_add(1, std::memory_order_relaxed); }
};

}  // namespace taiji
