// Receive buffers for the partial sums of reduce stages, reused across chunks and ops on
// the thread that runs them (a peer's I/O thread). A fresh chunk-sized allocation costs a
// page fault and the kernel's zeroing of every page, and std::vector's resize zeroes it
// again: two extra passes over every received byte on a path that is bound by memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace taiji {

class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  // bytes of uninitialised memory, from this thread's pool when it holds a buffer of that
  // size.
  explicit ScratchBuffer(size_t bytes);
  ~ScratchBuffer() { release(); }
  ScratchBuffer(ScratchBuffer&& other) noexcept;
  ScratchBuffer& operator=(ScratchBuffer&& other) noexcept;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  bool held() const { return data_ != nullptr; }
  // Back to the pool of the calling thread (up to its cap; else freed).
  void release();

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
};

}  // namespace taiji
