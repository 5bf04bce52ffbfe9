#include "transport/shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "common/byte_order.h"
#include "transport/frame.h"

namespace taiji {

namespace {

constexpr size_t kHeaderPage = 4096;
constexpr uint64_t kSegmentMagic = 0x474e4952'494a4154ull;  // "TAIJIRNG"
// Header page layout: magic, nonce, capacity; the consumer's position on its own cache line.
constexpr size_t kMagicAt = 0;
constexpr size_t kNonceAt = 8;
constexpr size_t kCapacityAt = 16;
constexpr size_t kConsumedAt = 64;
constexpr size_t kCreditAt = 128;
constexpr size_t kMailTailAt = 192;
constexpr size_t kMailHeadAt = 256;
constexpr size_t kPollingAt = 320;
// Record kinds.
constexpr uint32_t kRecordFrame = 0;
constexpr uint32_t kRecordSkip = 1;

uint64_t record_span(uint64_t len) { return (len + kShmRecordAlign - 1) / kShmRecordAlign * kShmRecordAlign; }
// What /proc/<pid>/fd/<fd> of a ring points to; anything else is never opened.
constexpr const char* kMemfdName = "taiji-ring";
constexpr const char* kMemfdLink = "/memfd:taiji-ring ";
constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

Status sys_error(const std::string& what) { return {Code::Io, what + ": " + std::strerror(errno)}; }

uint64_t random_nonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
}

}  // namespace

void encode_offer(const ShmSegmentInfo& info, uint8_t out[kShmOfferBytes]) {
  put64(out, (static_cast<uint64_t>(info.fd) << 32) | info.pid);
  put64(out + 8, info.capacity);
  put64(out + 16, info.nonce);
}

ShmSegmentInfo decode_offer(const uint8_t in[kShmOfferBytes]) {
  ShmSegmentInfo info;
  uint64_t ids = get64(in);
  info.pid = static_cast<uint32_t>(ids);
  info.fd = static_cast<uint32_t>(ids >> 32);
  info.capacity = get64(in + 8);
  info.nonce = get64(in + 16);
  return info;
}

void encode_descriptor(const ShmDescriptor& d, uint8_t out[kShmDescriptorBytes]) {
  put64(out, d.position);
  put64(out + 8, d.length);
}

ShmDescriptor decode_descriptor(const uint8_t in[kShmDescriptorBytes]) {
  return {get64(in), get64(in + 8)};
}

ShmSegment::~ShmSegment() { reset(); }

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this == &other) return *this;
  reset();
  base_ = other.base_;
  mapped_bytes_ = other.mapped_bytes_;
  fd_ = other.fd_;
  info_ = other.info_;
  other.base_ = nullptr;
  other.mapped_bytes_ = 0;
  other.fd_ = -1;
  return *this;
}

void ShmSegment::reset() {
  if (base_ != nullptr) munmap(base_, mapped_bytes_);
  base_ = nullptr;
  close_fd();
}

void ShmSegment::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

uint8_t* ShmSegment::data() const { return base_ + kHeaderPage + kShmMailboxBytes; }

uint8_t* ShmSegment::mailbox() const { return base_ + kHeaderPage; }

std::atomic<uint64_t>& ShmSegment::mail_tail() const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(base_ + kMailTailAt);
}

std::atomic<uint64_t>& ShmSegment::mail_head() const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(base_ + kMailHeadAt);
}

std::atomic<uint32_t>& ShmSegment::reader_polling() const {
  return *reinterpret_cast<std::atomic<uint32_t>*>(base_ + kPollingAt);
}

std::atomic<uint64_t>& ShmSegment::consumed() const {
  static_assert(std::atomic<uint64_t>::is_always_lock_free);
  return *reinterpret_cast<std::atomic<uint64_t>*>(base_ + kConsumedAt);
}

std::atomic<uint32_t>& ShmSegment::credit_wanted() const {
  static_assert(std::atomic<uint32_t>::is_always_lock_free);
  return *reinterpret_cast<std::atomic<uint32_t>*>(base_ + kCreditAt);
}

Result<ShmSegment> ShmSegment::create(uint64_t capacity) {
  if (capacity < kShmMinRingBytes || capacity > kShmMaxRingBytes) {
    return Status{Code::InvalidArgument, "ring size " + std::to_string(capacity) + " out of range"};
  }
  ShmSegment seg;
  seg.fd_ = memfd_create(kMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (seg.fd_ < 0) return sys_error("memfd_create");
  seg.mapped_bytes_ = kHeaderPage + kShmMailboxBytes + capacity;
  const auto bytes = static_cast<off_t>(seg.mapped_bytes_);
  if (ftruncate(seg.fd_, bytes) != 0) return sys_error("ftruncate");
  // Reserving the pages now turns a full memory cgroup into an error here, not a SIGBUS
  // in the middle of a copy.
  if (int rc = posix_fallocate(seg.fd_, 0, bytes); rc != 0) {
    errno = rc;
    return sys_error("fallocate");
  }
  // Sealed at its size: neither side can shrink it under the other's copy (a SIGBUS).
  if (fcntl(seg.fd_, F_ADD_SEALS, kSizeSeals) != 0) return sys_error("seal");
  void* p = mmap(nullptr, seg.mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                 seg.fd_, 0);
  if (p == MAP_FAILED) return sys_error("mmap");
  seg.base_ = static_cast<uint8_t*>(p);
  seg.info_ = {static_cast<uint32_t>(getpid()), static_cast<uint32_t>(seg.fd_), capacity,
               random_nonce()};
  put64(seg.base_ + kMagicAt, kSegmentMagic);
  put64(seg.base_ + kNonceAt, seg.info_.nonce);
  put64(seg.base_ + kCapacityAt, capacity);
  new (seg.base_ + kConsumedAt) std::atomic<uint64_t>(0);
  new (seg.base_ + kCreditAt) std::atomic<uint32_t>(0);
  new (seg.base_ + kMailTailAt) std::atomic<uint64_t>(0);
  new (seg.base_ + kMailHeadAt) std::atomic<uint64_t>(0);
  new (seg.base_ + kPollingAt) std::atomic<uint32_t>(0);
  return seg;
}

Result<ShmSegment> ShmSegment::open(const ShmSegmentInfo& info) {
  if (info.capacity < kShmMinRingBytes || info.capacity > kShmMaxRingBytes) {
    return Status{Code::Protocol, "offered ring size " + std::to_string(info.capacity) + " out of range"};
  }
  const std::string path = "/proc/" + std::to_string(info.pid) + "/fd/" + std::to_string(info.fd);
  // The descriptor number comes from a peer: make sure it names a ring before opening it,
  // so a wrong number can never open (and so disturb) a device, pipe or socket.
  char link[64] = {};
  ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
  if (n < 0) return sys_error("cannot read " + path);
  if (std::strncmp(link, kMemfdLink, std::strlen(kMemfdLink)) != 0) {
    return Status{Code::Protocol, path + " is not a ring (" + std::string(link) + ")"};
  }
  ShmSegment seg;
  seg.fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (seg.fd_ < 0) return sys_error("cannot open " + path);
  seg.mapped_bytes_ = kHeaderPage + kShmMailboxBytes + info.capacity;
  // Sealed first, so that the size checked next stays (F_GET_SEALS fails on anything but
  // a memfd: a file put in the ring's place is refused too).
  const int seals = fcntl(seg.fd_, F_GET_SEALS);
  if (seals < 0 || (seals & kSizeSeals) != kSizeSeals) {
    return Status{Code::Protocol, path + " is not sealed at its size"};
  }
  struct stat st {};
  if (fstat(seg.fd_, &st) != 0) return sys_error("fstat " + path);
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != seg.mapped_bytes_) {
    return Status{Code::Protocol, path + " is not the offered ring (size " +
                                      std::to_string(st.st_size) + ")"};
  }
  void* p = mmap(nullptr, seg.mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                 seg.fd_, 0);
  if (p == MAP_FAILED) return sys_error("mmap " + path);
  seg.base_ = static_cast<uint8_t*>(p);
  seg.close_fd();
  seg.info_ = info;
  if (get64(seg.base_ + kMagicAt) != kSegmentMagic || get64(seg.base_ + kNonceAt) != info.nonce ||
      get64(seg.base_ + kCapacityAt) != info.capacity) {
    return Status{Code::Protocol, path + " is not the offered ring (header differs)"};
  }
  return seg;
}

uint64_t shm_place(uint64_t end, uint64_t len, uint64_t capacity) {
  uint64_t off = end % capacity;
  return off + len > capacity ? end + (capacity - off) : end;
}

uint64_t shm_lap_start(uint64_t end, uint64_t capacity) {
  const uint64_t off = end % capacity;
  return off == 0 ? end : end + (capacity - off);
}

bool ShmProducer::push(const uint8_t* src, uint64_t len, ShmDescriptor* out) {
  const uint64_t cap = seg_.capacity();
  if (len == 0 || len > cap) return false;
  // The consumer finished reading everything before `consumed` before it published it.
  // Sequentially consistent with the credit flag: see push_or_ask.
  const uint64_t consumed = seg_.consumed().load(std::memory_order_seq_cst);
  // A consumer that claims more than was produced is broken (see check_consumer).
  if (consumed > next_) return false;
  const bool empty = consumed == next_;
  const uint64_t pos = empty ? shm_lap_start(next_, cap) : shm_place(next_, len, cap);
  const uint64_t free_from = empty ? pos : std::max(consumed, restarted_at_);
  if (pos + len - free_from > cap) return false;
  std::memcpy(seg_.data() + pos % cap, src, len);
  if (empty) restarted_at_ = pos;
  next_ = pos + len;
  *out = {pos, len};
  return true;
}

Status ShmProducer::check_consumer() const {
  const uint64_t consumed = seg_.consumed().load(std::memory_order_acquire);
  if (consumed <= next_) return {};
  return {Code::Protocol, "shared-memory ring consumed to position " + std::to_string(consumed) +
                              ", past the " + std::to_string(next_) + " bytes produced"};
}

bool ShmProducer::push_or_ask(const uint8_t* src, uint64_t len, ShmDescriptor* out) {
  if (push(src, len, out)) return true;
  // Flag, then look again; the consumer publishes its position, then reads the flag. One of
  // the two sees the other's store, so a release between the two looks is never missed.
  seg_.credit_wanted().store(1, std::memory_order_seq_cst);
  return push(src, len, out);
}

Status ShmConsumer::check(const ShmDescriptor& d, uint64_t max_payload) const {
  const uint64_t cap = seg_.capacity();
  if (d.length == 0 || d.length > cap || d.length > max_payload) {
    return {Code::Protocol, "shared-memory payload length " + std::to_string(d.length) +
                                " out of range (ring " + std::to_string(cap) + " bytes)"};
  }
  // Everything before next_ is released here, so the producer may have started over.
  const uint64_t want = shm_place(next_, d.length, cap);
  const uint64_t restart = shm_lap_start(next_, cap);
  if (d.position != want && d.position != restart) {
    return {Code::Protocol, "shared-memory payload at ring position " + std::to_string(d.position) +
                                ", expected " + std::to_string(want) +
                                (restart != want ? " or " + std::to_string(restart) : "")};
  }
  return {};
}

bool ShmConsumer::release(const ShmDescriptor& d) {
  next_ = d.position + d.length;
  seg_.consumed().store(next_, std::memory_order_seq_cst);
  return seg_.credit_wanted().load(std::memory_order_seq_cst) != 0 &&
         seg_.credit_wanted().exchange(0, std::memory_order_seq_cst) != 0;
}

bool ShmProducer::post(uint64_t tcp_before, const uint8_t* header, const std::string& name,
                       const uint8_t* payload, uint64_t payload_len) {
  const uint64_t len = kShmRecordHeader + kHeaderSize + name.size() + payload_len;
  if (len > kShmMaxRecord) return false;
  const uint64_t head = seg_.mail_head().load(std::memory_order_acquire);
  // A reader that claims more than was written is broken; stop writing to it.
  if (head > mail_tail_) return false;
  const uint64_t span = record_span(len);
  const uint64_t off = mail_tail_ % kShmMailboxBytes;
  const uint64_t skip = off + span > kShmMailboxBytes ? kShmMailboxBytes - off : 0;
  if (mail_tail_ + skip + span - head > kShmMailboxBytes) return false;
  uint8_t* box = seg_.mailbox();
  if (skip != 0) {
    put32(box + off, static_cast<uint32_t>(skip));
    put32(box + off + 4, kRecordSkip);
  }
  uint8_t* rec = box + (mail_tail_ + skip) % kShmMailboxBytes;
  put32(rec, static_cast<uint32_t>(len));
  put32(rec + 4, kRecordFrame);
  put64(rec + 8, tcp_before);
  std::memcpy(rec + kShmRecordHeader, header, kHeaderSize);
  std::memcpy(rec + kShmRecordHeader + kHeaderSize, name.data(), name.size());
  if (payload_len != 0) {
    std::memcpy(rec + kShmRecordHeader + kHeaderSize + name.size(), payload, payload_len);
  }
  mail_tail_ += skip + span;
  seg_.mail_tail().store(mail_tail_, std::memory_order_seq_cst);
  return true;
}

bool ShmProducer::reader_polls() const {
  return seg_.reader_polling().load(std::memory_order_seq_cst) != 0;
}

uint64_t ShmConsumer::mail_end() const {
  // Sequentially consistent: see set_polling.
  return seg_.mail_tail().load(std::memory_order_seq_cst);
}

Status ShmConsumer::peek(ShmRecord* rec, uint64_t tail) {
  *rec = {};
  for (;;) {
    if (tail == mail_head_) return {};
    if (tail < mail_head_ || tail - mail_head_ > kShmMailboxBytes || tail % kShmRecordAlign != 0) {
      return {Code::Protocol, "mailbox end " + std::to_string(tail) + " impossible after " +
                                  std::to_string(mail_head_)};
    }
    const uint8_t* at = seg_.mailbox() + mail_head_ % kShmMailboxBytes;
    const uint64_t room = kShmMailboxBytes - mail_head_ % kShmMailboxBytes;  // to the lap's end
    const uint64_t len = get32(at);
    const uint32_t kind = get32(at + 4);
    if (kind == kRecordSkip) {
      if (len != room || mail_head_ + len > tail) {
        return {Code::Protocol, "mailbox skip of " + std::to_string(len) + " bytes where " +
                                    std::to_string(room) + " remain"};
      }
      mail_head_ += len;
      mail_next_ = mail_head_;
      seg_.mail_head().store(mail_head_, std::memory_order_release);
      continue;
    }
    if (kind != kRecordFrame || len < kShmRecordHeader + kHeaderSize || len > kShmMaxRecord ||
        record_span(len) > room || mail_head_ + record_span(len) > tail) {
      return {Code::Protocol, "malformed mailbox record (kind " + std::to_string(kind) + ", " +
                                  std::to_string(len) + " bytes)"};
    }
    rec->tcp_before = get64(at + 8);
    rec->frame = at + kShmRecordHeader;
    rec->frame_len = len - kShmRecordHeader;
    mail_next_ = mail_head_ + record_span(len);
    return {};
  }
}

void ShmConsumer::pop() {
  mail_head_ = mail_next_;
  seg_.mail_head().store(mail_head_, std::memory_order_release);
}

bool ShmConsumer::has_mail() const {
  // Sequentially consistent, after set_polling: see ShmTransport::resume_reading.
  return seg_.mail_tail().load(std::memory_order_seq_cst) != mail_head_;
}

void ShmConsumer::set_polling(bool on) {
  seg_.reader_polling().store(on ? 1 : 0, std::memory_order_seq_cst);
}

}  // namespace taiji
