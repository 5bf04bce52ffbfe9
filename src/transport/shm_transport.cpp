#include "transport/shm_transport.h"

#include <cstring>

#include "monitor/log.h"

namespace taiji {

namespace {

// The name every ShmOffer and ShmReply carries (frames need a non-empty name).
const char* const kShmFrameName = "shm";

Status protocol(int src, const std::string& what) {
  return {Code::Protocol, "rank " + std::to_string(src) + ": " + what};
}

}  // namespace

ShmTransport::ShmTransport(ShmOptions options, Transport* inner, ReceiveHandler* handler)
    : opt_(std::move(options)), inner_(inner), handler_(handler), links_(opt_.size) {
  opt_.limits.world_size = static_cast<uint32_t>(opt_.size);
}

ShmTransport::~ShmTransport() {
  for (int r = 0; r < opt_.size; ++r) {
    const Link& link = links_[r];
    if (link.ring_frames + link.full_frames == 0) continue;
    log().debug("to rank {}: {} payloads through the shared-memory ring, {} over TCP (ring full)",
                r, link.ring_frames, link.full_frames);
  }
}

void ShmTransport::start(const std::vector<int>& host_of) {
  if (!opt_.enabled) return;
  for (int r = 0; r < opt_.size; ++r) {
    if (r == opt_.rank || host_of[r] != host_of[opt_.rank]) continue;
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
    inner_->send(r, std::move(offer));
  }
}

bool ShmTransport::active_to(int dst) const {
  return dst >= 0 && dst < opt_.size && links_[dst].out_active;
}

void ShmTransport::send(int dst, OutMessage msg) {
  const bool bulk = msg.header.type == MsgType::Data &&
                    (msg.owned.empty() ? msg.payload_len : msg.owned.size()) >= kShmMinPayload;
  if (bulk && active_to(dst)) {
    const uint8_t* payload = msg.owned.empty() ? msg.payload : msg.owned.data();
    const uint64_t len = msg.owned.empty() ? msg.payload_len : msg.owned.size();
    ShmDescriptor where;
    if (links_[dst].out->push(payload, len, &where)) {
      msg.header.type = MsgType::ShmData;
      msg.owned.assign(kShmDescriptorBytes, 0);
      encode_descriptor(where, msg.owned.data());
      msg.payload = nullptr;
      msg.payload_len = 0;
      if (opt_.link_counters != nullptr) opt_.link_counters[dst].add_sent(len);
      links_[dst].ring_frames++;
    } else {
      links_[dst].full_frames++;
    }
  }
  inner_->send(dst, std::move(msg));
}

Status ShmTransport::accept_frame(int src, const FrameHeader& h, const std::string& name,
                                  uint8_t** target) {
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
      if (link.out == nullptr || link.out_active) return protocol(src, "ShmReply to no offer");
      *target = nullptr;
      return {};
    case MsgType::ShmData:
      if (link.in == nullptr) return protocol(src, "ShmData without a shared-memory ring");
      *target = link.rx;
      return {};
    default:
      return handler_->accept_frame(src, h, name, target);
  }
}

void ShmTransport::frame_done(int src, const FrameHeader& h, const std::string& name) {
  switch (h.type) {
    case MsgType::ShmOffer: return on_offer(src, name);
    case MsgType::ShmReply: return on_reply(src, h);
    case MsgType::ShmData: return on_data(src, h, name);
    default: return handler_->frame_done(src, h, name);
  }
}

void ShmTransport::link_down(int src, bool graceful, const Status& why) {
  links_[src].out_active = false;
  handler_->link_down(src, graceful, why);
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
      reply.header.chunk = 1;
      log().debug("rank {} sends through shared memory", src);
    } else {
      log().info("declining rank {}'s shared-memory ring (TCP carries its data): {}", src,
                 seg.status().message());
    }
  }
  inner_->send(src, std::move(reply));
}

void ShmTransport::on_reply(int src, const FrameHeader& h) {
  Link& link = links_[src];
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
  data.type = MsgType::Data;
  data.payload_len = where.length;
  uint8_t encoded[kHeaderSize];
  encode_header(data, encoded);
  if (Status s = decode_header(encoded, opt_.limits, &data); !s.is_ok()) {
    return inner_->drop(src, protocol(src, "ShmData: " + s.message()));
  }
  uint8_t* target = nullptr;
  if (Status s = handler_->accept_frame(src, data, name, &target); !s.is_ok()) {
    return inner_->drop(src, s);
  }
  if (target != nullptr) std::memcpy(target, link.in->at(where), where.length);
  link.in->release(where);
  if (opt_.link_counters != nullptr) opt_.link_counters[src].add_received(where.length);
  handler_->frame_done(src, data, name);
}

}  // namespace taiji
