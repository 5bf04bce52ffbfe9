#include "transport/shm_transport.h"

#include <cstring>

#include "monitor/log.h"

namespace taiji {

namespace {

// The name every ShmOffer and ShmReply carries (frames need a non-empty name).
const char* const kShmFrameName = "shm";
// ShmReply's chunk: 0 declined, 1 mapped, kCredit "room in the ring you wait for".
constexpr uint32_t kCredit = 2;

Status protocol(int src, const std::string& what) {
  return {Code::Protocol, "rank " + std::to_string(src) + ": " + what};
}

}  // namespace

ShmTransport::ShmTransport(ShmOptions options, Transport* inner, ReceiveHandler* handler)
    : opt_(std::move(options)), inner_(inner), handler_(handler), links_(opt_.cluster->size) {
}

ShmTransport::~ShmTransport() {
  for (int r = 0; r < opt_.cluster->size; ++r) {
    const Link& link = links_[r];
    if (link.ring_frames + link.tcp_frames + link.mail_frames == 0) continue;
    log().debug("to rank {}: {} payloads through the shared-memory ring ({} waits for room), "
                "{} too large for its free room over TCP; {} frames through the mailbox "
                "({} doorbells)",
                r, link.ring_frames, link.waits, link.tcp_frames, link.mail_frames, link.bells);
  }
}

FrameLimits ShmTransport::limits() const {
  FrameLimits l = opt_.limits;
  l.world_size = static_cast<uint32_t>(opt_.cluster->size);
  l.cluster_version = opt_.cluster->version;
  return l;
}

void ShmTransport::start(const std::vector<int>& host_of) {
  if (!opt_.enabled) return;
  for (int r = 0; r < opt_.cluster->size; ++r) {
    if (r == opt_.cluster->rank || host_of[r] != host_of[opt_.cluster->rank]) continue;
    auto seg = ShmSegment::create(opt_.ring_bytes);
    if (!seg.is_ok()) {
      log().warn("no shared-memory ring to rank {} (TCP carries its data): {}", r,
                 seg.status().message());
      continue;
    }
    OutMessage offer;
    offer.header.type = MsgType::ShmOffer;
    offer.name = kShmFrameName;
    offer.owned.resize(kShmOfferBytes);
    encode_offer(seg.value().info(), offer.owned.data());
    links_[r].out = std::make_unique<ShmProducer>(std::move(seg.value()));
    to_tcp(r, std::move(offer));
  }
}

bool ShmTransport::active_to(int dst) const {
  return dst >= 0 && dst < opt_.cluster->size && links_[dst].out_active;
}

void ShmTransport::send(int dst, OutMessage msg) {
  // Behind frames already waiting for room, in order; else it waits only if the ring is full.
  const bool behind = dst >= 0 && dst < opt_.cluster->size && !links_[dst].waiting.empty();
  if (!behind && try_send(dst, msg)) return;
  Link& link = links_[dst];
  if (!behind) link.waits++;
  link.waiting_bytes += msg.payload_size();
  link.waiting.push_back(std::move(msg));
}

bool ShmTransport::try_send(int dst, OutMessage& msg) {
  const uint64_t len = msg.payload_size();
  // The two types a ShmData frame can stand for (frame.h): the receiver tells them apart
  // by op_kind, which a ModelReply leaves 0.
  const bool bulk = msg.header.type == MsgType::Data ||
                    (msg.header.type == MsgType::ModelReply && msg.header.op_kind == OpKind::None);
  if (bulk && len >= kShmMinPayload && active_to(dst)) {
    Link& link = links_[dst];
    const uint8_t* payload = msg.payload_data();
    ShmDescriptor where;
    const bool may_wait = len <= link.out->max_waiting_payload();
    if (may_wait ? link.out->push_or_ask(payload, len, &where) : link.out->push(payload, len, &where)) {
      msg.header.type = MsgType::ShmData;
      msg.owned.assign(kShmDescriptorBytes, 0);
      encode_descriptor(where, msg.owned.data());
      msg.payload = nullptr;
      msg.payload_len = 0;
      if (opt_.link_counters != nullptr) opt_.link_counters[dst].add_shm_sent(len);
      link.ring_frames++;
    } else if (Status s = link.out->check_consumer(); !s.is_ok()) {
      // No room will ever come: this and later frames go over TCP, in order, and the link
      // closes with the error (from the loop: a drop reaches link_down, which takes
      // `waiting` apart, and this may run on its front).
      link.out_active = false;
      inner_->defer([this, dst, why = protocol(dst, s.message())] { inner_->drop(dst, why); });
    } else if (may_wait) {
      return false;
    } else {
      link.tcp_frames++;
    }
  }
  emit(dst, std::move(msg));
  return true;
}

void ShmTransport::emit(int dst, OutMessage msg) {
  if (!active_to(dst)) return to_tcp(dst, std::move(msg));
  Link& link = links_[dst];
  FrameHeader h = msg.header;
  h.src_rank = static_cast<uint32_t>(opt_.cluster->rank);
  h.cluster_version = opt_.cluster->version;
  h.name_len = static_cast<uint16_t>(msg.name.size());
  h.payload_len = msg.payload_size();
  uint8_t header[kHeaderSize];
  encode_header(h, header);
  if (!link.out->post(link.tcp_sent, header, msg.name, msg.payload_data(), h.payload_len)) {
    return to_tcp(dst, std::move(msg));
  }
  link.mail_frames++;
  if (opt_.link_counters != nullptr) {
    opt_.link_counters[dst].add_shm_sent(kHeaderSize + h.name_len + h.payload_len);
  }
  if (msg.on_sent) inner_->defer([cb = std::move(msg.on_sent)] { cb({}); });
  if (link.out->reader_polls()) return;
  OutMessage bell;
  bell.header.type = MsgType::ShmBell;
  bell.name = kShmFrameName;
  link.bells++;
  to_tcp(dst, std::move(bell));
}

void ShmTransport::to_tcp(int dst, OutMessage msg) {
  if (dst >= 0 && dst < opt_.cluster->size) links_[dst].tcp_sent++;
  inner_->send(dst, std::move(msg));
}

void ShmTransport::send_waiting(int dst) {
  Link& link = links_[dst];
  while (!link.waiting.empty()) {
    OutMessage& msg = link.waiting.front();
    const uint64_t len = msg.payload_size();
    if (!try_send(dst, msg)) return;
    link.waiting_bytes -= len;
    link.waiting.pop_front();
  }
}

void ShmTransport::flush_waiting(int dst) {
  Link& link = links_[dst];
  std::deque<OutMessage> waiting = std::move(link.waiting);
  link.waiting.clear();
  link.waiting_bytes = 0;
  for (OutMessage& msg : waiting) to_tcp(dst, std::move(msg));
}

uint64_t ShmTransport::queued_bytes(int dst) const {
  const uint64_t waiting = dst >= 0 && dst < opt_.cluster->size ? links_[dst].waiting_bytes : 0;
  return inner_->queued_bytes(dst) + waiting;
}

void ShmTransport::shutdown(std::function<void()> on_closed) {
  // Waiting frames go out before the Bye.
  for (int r = 0; r < opt_.cluster->size; ++r) {
    links_[r].out_active = false;
    flush_waiting(r);
  }
  inner_->shutdown(std::move(on_closed));
}

void ShmTransport::close_now(std::function<void()> on_closed) {
  inner_->close_now(std::move(on_closed));
  // With the links closed, TCP reports each waiting frame as not sent.
  for (int r = 0; r < opt_.cluster->size; ++r) {
    links_[r].out_active = false;
    flush_waiting(r);
  }
}

void ShmTransport::pause_reading(int src) {
  Link& link = links_[src];
  link.paused = true;
  if (link.in != nullptr) link.in->set_polling(false);
  inner_->pause_reading(src);
}

void ShmTransport::resume_reading(int src) {
  Link& link = links_[src];
  link.paused = false;
  inner_->resume_reading(src);
  if (link.in == nullptr || link.down) return;
  link.in->set_polling(polling_);
  // Mail that came while paused has no doorbell coming: have the loop look.
  if (link.in->has_mail() && opt_.request_poll) opt_.request_poll();
}

void ShmTransport::set_polling(bool on) {
  polling_ = on;
  for (Link& link : links_) {
    if (link.in != nullptr && !link.down) link.in->set_polling(on && !link.paused);
  }
}

void ShmTransport::retry_waiting() {
  for (int r = 0; r < opt_.cluster->size; ++r) {
    if (links_[r].out_active && !links_[r].waiting.empty()) send_waiting(r);
  }
}

void ShmTransport::poll() {
  retry_waiting();
  for (int r = 0; r < opt_.cluster->size; ++r) {
    const Link& link = links_[r];
    if (link.in == nullptr || link.down || link.paused) continue;
    if (Status s = deliver_mail(r, false); !s.is_ok()) inner_->drop(r, s);
  }
}

Status ShmTransport::deliver_mail(int src, bool any_time) {
  Link& link = links_[src];
  // Not again from inside a delivery (a handler dropping the link of a rank that said Bye
  // reaches link_down from here): the record being delivered is not popped yet.
  if (link.in == nullptr || link.delivering) return {};
  // Nor while a TCP frame's payload is still arriving: its handler holds that frame's
  // receive state until frame_done. (Mail for the frame after it waits anyway; only a
  // misbehaving peer tags a record so that it could be delivered here.)
  if (link.tcp_in_frame) return {};
  link.delivering = true;
  struct Done {
    bool* flag;
    ~Done() { *flag = false; }
  } done{&link.delivering};
  // Only what was published before this pass: a writer that keeps posting must not hold
  // the I/O thread here, away from its timers (op deadlines) and other peers, nor, with
  // `any_time` while paused, keep adding early arrivals past the cap. A TCP frame's mail
  // was published before that frame was sent, so it is all below this end.
  const uint64_t end = link.in->mail_end();
  bool delivered = false;
  while (!link.down && (any_time || !link.paused)) {
    ShmRecord rec;
    if (Status s = link.in->peek(&rec, end); !s.is_ok()) return protocol(src, s.message());
    if (rec.frame == nullptr) {
      // More came in meanwhile; it has no doorbell coming if it was posted while we polled.
      // A polling loop comes back anyway, and a pass that found nothing read the end just
      // now: no second look, no hand-over to the loop, on the hot path.
      if (delivered && !polling_ && !link.paused && link.in->has_mail() && opt_.request_poll) {
        opt_.request_poll();
      }
      return {};
    }
    if (rec.tcp_before > link.tcp_done) return {};
    if (rec.tcp_before < link.tcp_done) {
      return protocol(src, "mailbox frame after " + std::to_string(rec.tcp_before) +
                               " TCP frames arrived after " + std::to_string(link.tcp_done));
    }
    Status s = deliver_record(src, rec);
    // After frame_done: the handler may read the payload in the mailbox until then.
    link.in->pop();
    delivered = true;
    if (!s.is_ok()) return s;
  }
  return {};
}

Status ShmTransport::deliver_record(int src, const ShmRecord& rec) {
  // The writer may still change the record: decide everything on a private copy.
  uint8_t raw[kHeaderSize];
  std::memcpy(raw, rec.frame, kHeaderSize);
  FrameHeader h;
  if (Status s = decode_header(raw, limits(), &h); !s.is_ok()) {
    return protocol(src, "mailbox: " + s.message());
  }
  if (static_cast<int>(h.src_rank) != src) {
    return protocol(src, "mailbox frame claims rank " + std::to_string(h.src_rank));
  }
  switch (h.type) {
    case MsgType::Ready: case MsgType::Data: case MsgType::Abort: case MsgType::Query:
    case MsgType::Answer: case MsgType::ShmReply: case MsgType::ShmData:
    case MsgType::ModelRequest: case MsgType::ModelReply: case MsgType::Device:
      break;
    default:
      return protocol(src, "frame of type " + std::to_string(static_cast<int>(h.type)) +
                               " in the mailbox");
  }
  if (kHeaderSize + h.name_len + h.payload_len != rec.frame_len) {
    return protocol(src, "mailbox record of " + std::to_string(rec.frame_len) +
                             " bytes holds a frame of " +
                             std::to_string(kHeaderSize + h.name_len + h.payload_len));
  }
  const std::string name(reinterpret_cast<const char*>(rec.frame + kHeaderSize), h.name_len);
  ++mail_delivered_;
  return hand_over(src, h, name, rec.frame + kHeaderSize + h.name_len, rec.frame_len);
}

Status ShmTransport::hand_over(int src, const FrameHeader& h, const std::string& name,
                               const uint8_t* payload, uint64_t counted) {
  uint8_t* target = nullptr;
  if (Status s = dispatch_accept(src, h, name, payload, &target); !s.is_ok()) return s;
  if (target != nullptr && h.payload_len != 0) std::memcpy(target, payload, h.payload_len);
  if (opt_.link_counters != nullptr) opt_.link_counters[src].add_received(counted);
  // The handler may read the payload where it lies until frame_done returns.
  dispatch_done(src, h, name);
  return {};
}

Status ShmTransport::accept_frame(int src, const FrameHeader& h, const std::string& name,
                                  const uint8_t* in_memory, uint8_t** target) {
  // Mail sent before this frame goes first, even to a paused handler: order comes first,
  // and a mailbox holds little.
  if (Status s = deliver_mail(src, true); !s.is_ok()) return s;
  if (links_[src].down) {
    *target = nullptr;
    return {};
  }
  links_[src].tcp_in_frame = true;
  return dispatch_accept(src, h, name, in_memory, target);
}

void ShmTransport::frame_done(int src, const FrameHeader& h, const std::string& name) {
  Link& link = links_[src];
  link.tcp_in_frame = false;
  link.tcp_done++;
  if (link.down) return;
  dispatch_done(src, h, name);
  if (Status s = deliver_mail(src, false); !s.is_ok()) inner_->drop(src, s);
}

Status ShmTransport::dispatch_accept(int src, const FrameHeader& h, const std::string& name,
                                     const uint8_t* in_memory, uint8_t** target) {
  Link& link = links_[src];
  switch (h.type) {
    case MsgType::ShmOffer:
      if (h.payload_len != kShmOfferBytes) {
        return protocol(src, "ShmOffer with a " + std::to_string(h.payload_len) + "-byte payload");
      }
      if (link.in != nullptr) return protocol(src, "second ShmOffer");
      *target = link.rx;
      return {};
    case MsgType::ShmReply:
      if (h.payload_len != 0) return protocol(src, "ShmReply with a payload");
      if (h.chunk == kCredit) {
        // A credit may cross our link going down; without a ring it means nothing.
        if (link.out == nullptr) return protocol(src, "ShmReply credit without a ring");
      } else if (h.chunk > 1) {
        return protocol(src, "ShmReply with answer " + std::to_string(h.chunk));
      } else if (link.out == nullptr || link.out_active) {
        return protocol(src, "ShmReply to no offer");
      }
      *target = nullptr;
      return {};
    case MsgType::ShmData:
      if (link.in == nullptr) return protocol(src, "ShmData without a shared-memory ring");
      *target = link.rx;
      return {};
    case MsgType::ShmBell:
      if (h.payload_len != 0) return protocol(src, "ShmBell with a payload");
      if (link.in == nullptr) return protocol(src, "ShmBell without a mailbox");
      *target = nullptr;  // frame_done delivers the mail
      return {};
    default:
      return handler_->accept_frame(src, h, name, in_memory, target);
  }
}

void ShmTransport::dispatch_done(int src, const FrameHeader& h, const std::string& name) {
  switch (h.type) {
    case MsgType::ShmOffer: return on_offer(src, name);
    case MsgType::ShmReply: return on_reply(src, h);
    case MsgType::ShmData: return on_data(src, h, name);
    case MsgType::ShmBell: return;
    default: return handler_->frame_done(src, h, name);
  }
}

void ShmTransport::link_down(int src, bool graceful, const Status& why) {
  Link& link = links_[src];
  // Nothing more to that rank, not even a reply to the mail below: it reads no more.
  link.out_active = false;
  // Everything sent before the Bye is in: deliver the mail among it.
  if (graceful && !link.down) {
    if (Status s = deliver_mail(src, true); !s.is_ok()) log().warn("{}", s.message());
  }
  link.down = true;
  handler_->link_down(src, graceful, why);
  // TCP reports each waiting frame as not sent.
  flush_waiting(src);
}

void ShmTransport::on_offer(int src, const std::string&) {
  Link& link = links_[src];
  OutMessage reply;
  reply.header.type = MsgType::ShmReply;
  reply.name = kShmFrameName;
  reply.header.chunk = 0;
  if (opt_.enabled) {
    auto seg = ShmSegment::open(decode_offer(link.rx));
    if (seg.is_ok()) {
      link.in = std::make_unique<ShmConsumer>(std::move(seg.value()));
      link.in->set_polling(polling_ && !link.paused);
      reply.header.chunk = 1;
      log().debug("rank {} sends through shared memory", src);
    } else {
      log().info("declining rank {}'s shared-memory ring (TCP carries its data): {}", src,
                 seg.status().message());
    }
  }
  to_tcp(src, std::move(reply));
}

void ShmTransport::on_reply(int src, const FrameHeader& h) {
  Link& link = links_[src];
  if (h.chunk == kCredit) {
    if (link.out_active) send_waiting(src);
    return;
  }
  if (h.chunk == 1) {
    link.out_active = true;
    // The receiver holds its own mapping now; ours stays, the descriptor can go.
    link.out->segment().close_fd();
  } else {
    link.out.reset();
  }
}

void ShmTransport::on_data(int src, const FrameHeader& h, const std::string& name) {
  Link& link = links_[src];
  const ShmDescriptor where = decode_descriptor(link.rx);
  if (Status s = link.in->check(where, opt_.limits.max_payload); !s.is_ok()) {
    return inner_->drop(src, protocol(src, s.message()));
  }
  // The frame as if its payload had come over TCP, validated like one.
  FrameHeader data = h;
  data.type = h.op_kind == OpKind::None ? MsgType::ModelReply : MsgType::Data;
  data.payload_len = where.length;
  uint8_t encoded[kHeaderSize];
  encode_header(data, encoded);
  if (Status s = decode_header(encoded, limits(), &data); !s.is_ok()) {
    return inner_->drop(src, protocol(src, "ShmData: " + s.message()));
  }
  if (Status s = hand_over(src, data, name, link.in->at(where), where.length); !s.is_ok()) {
    return inner_->drop(src, s);
  }
  if (link.in->release(where)) {
    OutMessage credit;
    credit.header.type = MsgType::ShmReply;
    credit.header.chunk = kCredit;
    credit.name = kShmFrameName;
    emit(src, std::move(credit));
  }
}

}  // namespace taiji
