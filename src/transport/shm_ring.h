// A single-producer, single-consumer byte ring in a shared-memory segment, one per directed
// pair of peers on the same host. The sender copies a payload in and tells the receiver
// over TCP where it is ("position P, length L"); the receiver copies it out into place and
// returns the space by publishing how far it has consumed.
//
// Positions are 64-bit and only grow; position p lives at byte p % capacity. A payload is
// never split: one that would cross the end starts at the next multiple of capacity. A
// payload sent when the receiver has consumed everything also starts at the next multiple
// of capacity (the ring's first byte): one op after another then reuses the same bytes,
// still in both sides' caches, instead of streaming through the whole ring (at 1 MiB that
// halves the time of an allreduce). So the next payload starts at one of two positions
// fixed by the previous one and its length, and the receiver checks every position it is
// told against them (a peer's frame is never trusted).
//
// Each segment also holds a mailbox: a second, small ring of whole frames (header, name,
// payload), each tagged with how many frames the sender had sent over TCP before it. A
// receiver that polls reads them without any system call, so small frames between peers
// on one host need no TCP at all while both sides are busy; the tag keeps one ordered
// stream across TCP and the mailbox (shm_transport.h).
//
// The segment is a memfd: it has no name in /dev/shm, so a crash leaves nothing behind.
// The receiver opens it through /proc/<pid>/fd/<fd> while the sender still holds it open,
// and checks its size and a random nonce written in its header.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace taiji {

// How a segment is found by the other side (the payload of a ShmOffer frame).
struct ShmSegmentInfo {
  uint32_t pid = 0;
  uint32_t fd = 0;
  uint64_t capacity = 0;  // ring bytes, excluding the header page
  uint64_t nonce = 0;
};
constexpr size_t kShmOfferBytes = 24;
void encode_offer(const ShmSegmentInfo& info, uint8_t out[kShmOfferBytes]);
ShmSegmentInfo decode_offer(const uint8_t in[kShmOfferBytes]);

// Where a payload sits in the ring (the payload of a ShmData frame).
struct ShmDescriptor {
  uint64_t position = 0;
  uint64_t length = 0;
};
constexpr size_t kShmDescriptorBytes = 16;
void encode_descriptor(const ShmDescriptor& d, uint8_t out[kShmDescriptorBytes]);
ShmDescriptor decode_descriptor(const uint8_t in[kShmDescriptorBytes]);

// Rings smaller than this are refused: a header page plus room for a few chunks.
constexpr uint64_t kShmMinRingBytes = 64 << 10;
constexpr uint64_t kShmMaxRingBytes = 1ull << 34;

// The mailbox's size, and the largest record it takes (larger frames go over TCP).
constexpr uint64_t kShmMailboxBytes = 64 << 10;
constexpr uint64_t kShmMaxRecord = 8 << 10;
// A record: u32 length (of the whole record), u32 kind, u64 TCP frames sent before it,
// then the frame. Records start on 64-byte boundaries and never wrap; a "skip" record
// sends the reader to the start of the next lap.
constexpr uint64_t kShmRecordHeader = 16;
constexpr uint64_t kShmRecordAlign = 64;

// One frame found in a mailbox. `frame` points into shared memory: the writer may change
// it at any time, so the reader copies what it checks.
struct ShmRecord {
  uint64_t tcp_before = 0;
  const uint8_t* frame = nullptr;  // nullptr: no record published
  uint64_t frame_len = 0;
};

// A mapped segment: header page, the mailbox, then capacity ring bytes. Move-only; unmaps on destruction.
class ShmSegment {
 public:
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Creates and maps a new segment (the sending side); the fd stays open until close_fd().
  static Result<ShmSegment> create(uint64_t capacity);
  // Maps the segment another process offered (the receiving side) and checks it.
  static Result<ShmSegment> open(const ShmSegmentInfo& info);

  ShmSegmentInfo info() const { return info_; }
  void close_fd();
  bool mapped() const { return base_ != nullptr; }
  uint64_t capacity() const { return info_.capacity; }
  uint8_t* data() const;
  // The consumer's published position: everything before it may be overwritten.
  std::atomic<uint64_t>& consumed() const;
  // Set by a producer that found the ring full: the consumer owes it a wake-up.
  std::atomic<uint32_t>& credit_wanted() const;
  uint8_t* mailbox() const;
  // Mailbox positions (only grow; position p lives at byte p % kShmMailboxBytes): the
  // writer's end of what it published, and the reader's end of what it consumed.
  std::atomic<uint64_t>& mail_tail() const;
  std::atomic<uint64_t>& mail_head() const;
  // Set by the reader while it polls the mailbox: the writer then rings no doorbell.
  std::atomic<uint32_t>& reader_polling() const;

 private:
  void reset();

  uint8_t* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  int fd_ = -1;
  ShmSegmentInfo info_;
};

// The sending side's view of a ring. Only the I/O thread that owns it calls it.
class ShmProducer {
 public:
  explicit ShmProducer(ShmSegment segment) : seg_(std::move(segment)) {}
  ShmSegment& segment() { return seg_; }
  // Copies len bytes into the ring if there is room; returns where, or false when full.
  bool push(const uint8_t* src, uint64_t len, ShmDescriptor* out);
  // Like push, but when the ring is full asks the consumer for a wake-up (and checks once
  // more, so a release in between is never missed).
  bool push_or_ask(const uint8_t* src, uint64_t len, ShmDescriptor* out);
  // Payloads up to this size always fit once the consumer caught up (they start over at
  // the ring's first byte), so waiting for room is safe; larger ones never fit.
  uint64_t max_waiting_payload() const { return seg_.capacity(); }
  // An error when the consumer claims to have consumed more than was produced: it is
  // broken, and no push succeeds again.
  Status check_consumer() const;

  // Appends one mailbox record holding a frame (its encoded header, name and payload);
  // false, with nothing written, when it does not fit now.
  bool post(uint64_t tcp_before, const uint8_t* header, const std::string& name,
            const uint8_t* payload, uint64_t payload_len);
  // After a post: whether the reader promised to look without a doorbell. Sequentially
  // consistent with the post's publication (see ShmConsumer::set_polling).
  bool reader_polls() const;

 private:
  ShmSegment seg_;
  uint64_t next_ = 0;
  uint64_t mail_tail_ = 0;
  // Where the current lap was started over on an empty ring: the skipped bytes before it
  // were never written, so they count as consumed.
  uint64_t restarted_at_ = 0;
};

// The receiving side's view of a ring.
class ShmConsumer {
 public:
  explicit ShmConsumer(ShmSegment segment) : seg_(std::move(segment)) {}
  // Checks that d is exactly where the next payload must be; the error names what is wrong.
  Status check(const ShmDescriptor& d, uint64_t max_payload) const;
  const uint8_t* at(const ShmDescriptor& d) const { return seg_.data() + d.position % seg_.capacity(); }
  // Hands d's bytes back to the producer; d must have passed check(). Returns whether the
  // producer asked to be told (it is waiting for room).
  bool release(const ShmDescriptor& d);

  // The writer's end of the mailbox now. A reader that reads only up to it is not kept
  // reading by a writer that goes on posting.
  uint64_t mail_end() const;
  // The oldest unread mailbox record before `end` (a mail_end()), or rec->frame == nullptr
  // when there is none. An error names what is malformed; the mailbox is then unusable.
  Status peek(ShmRecord* rec, uint64_t end);
  // Hands the record peek returned back to the writer.
  void pop();
  // Whether the writer has published anything not yet popped.
  bool has_mail() const;
  // Promises (or stops promising) to poll. Turning it off is sequentially consistent with
  // the writer's reader_polls(): a reader that peeks once more afterwards misses nothing.
  void set_polling(bool on);

 private:
  ShmSegment seg_;
  uint64_t next_ = 0;
  uint64_t mail_head_ = 0;
  uint64_t mail_next_ = 0;  // past the record peek returned
};

// Where a payload of len bytes goes when the previous one ended at `end` and the ring is
// not empty.
uint64_t shm_place(uint64_t end, uint64_t len, uint64_t capacity);
// Where a payload goes when the previous one ended at `end` and the consumer has released
// everything: the start of the next lap (`end` itself if it is one).
uint64_t shm_lap_start(uint64_t end, uint64_t capacity);

}  // namespace taiji
