#include "collectives/scratch_pool.h"

#include <utility>
#include <vector>

namespace taiji {

namespace {

// Enough for every partial of a few large ops in flight; beyond it buffers are freed.
constexpr size_t kMaxPooledBytes = 64ull << 20;

struct Pool {
  std::vector<std::pair<size_t, std::unique_ptr<uint8_t[]>>> free;
  size_t bytes = 0;
};

Pool& pool() {
  thread_local Pool p;
  return p;
}

}  // namespace

ScratchBuffer::ScratchBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) {
    // A zero-length partial still marks its arrival.
    data_.reset(new uint8_t[1]);
    return;
  }
  Pool& p = pool();
  for (size_t i = p.free.size(); i-- > 0;) {
    if (p.free[i].first == bytes) {
      data_ = std::move(p.free[i].second);
      p.free.erase(p.free.begin() + static_cast<std::ptrdiff_t>(i));
      p.bytes -= bytes;
      return;
    }
  }
  data_.reset(new uint8_t[bytes]);  // default-initialised: not zeroed
}

ScratchBuffer::ScratchBuffer(ScratchBuffer&& other) noexcept
    : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}

ScratchBuffer& ScratchBuffer::operator=(ScratchBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void ScratchBuffer::release() {
  if (!data_) return;
  Pool& p = pool();
  if (size_ > 0 && p.bytes + size_ <= kMaxPooledBytes) {
    p.free.emplace_back(size_, std::move(data_));
    p.bytes += size_;
  }
  data_.reset();
  size_ = 0;
}

}  // namespace taiji
