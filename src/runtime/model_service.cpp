#include "runtime/model_service.h"

#include <algorithm>

namespace taiji {

namespace {

constexpr uint8_t kReplyData = 0;
constexpr uint8_t kReplyError = 1;

}  // namespace

ModelService::ModelService(int rank, int size, ModelStore* store, uint64_t chunk_bytes)
    : rank_(rank),
      store_(store),
      chunk_bytes_(std::max<uint64_t>(chunk_bytes, 1)),
      serving_(static_cast<size_t>(size)),
      open_frames_(static_cast<size_t>(size)),
      down_(static_cast<size_t>(size), false) {}

void ModelService::serve(Router& router) {
  router.add(MsgType::ModelRequest, this);
  router.add(MsgType::ModelReply, this);
}

std::string ModelService::describe(const Pending& p) const {
  return "model request for '" + p.name + "' " +
         (p.version == 0 ? std::string("(latest)") : "version " + std::to_string(p.version)) +
         " from rank " + std::to_string(p.rank);
}

void ModelService::start(int rank, std::string name, uint64_t version, uint8_t* buf,
                         uint64_t bytes, uint64_t now_ms, uint64_t deadline_ms,
                         std::shared_ptr<RequestState> state) {
  if (closed_) return state->complete(closed_why_);
  Pending p;
  p.rank = rank;
  p.name = std::move(name);
  p.version = version;
  p.buf = buf;
  p.bytes = bytes;
  p.started_ms = now_ms;
  p.deadline_ms = deadline_ms;
  p.state = std::move(state);
  if (down_[rank]) {
    return p.state->complete({Code::PeerLost, describe(p) + ": rank " + std::to_string(rank) +
                                                  " is gone (its link is down)"});
  }
  // Ids wrap after 2^32 requests; one still pending that long is skipped.
  uint32_t id = next_id_++;
  while (id == 0 || pending_.count(id) != 0) id = next_id_++;
  OutMessage m;
  m.header.type = MsgType::ModelRequest;
  m.header.op_version = version;
  m.header.count = bytes;
  m.header.chunk = id;
  m.name = p.name;
  pending_.emplace(id, std::move(p));
  transport_->send(rank, std::move(m));
}

void ModelService::finish(uint32_t id, Status status) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  std::shared_ptr<RequestState> state = std::move(it->second.state);
  pending_.erase(it);
  state->complete(status);
}

void ModelService::fail_or_defer(uint32_t id, Status why) {
  Pending& p = pending_.at(id);
  if (p.frames_open == 0) return finish(id, why);
  if (!p.failed) {
    p.failed = true;
    p.failure = std::move(why);
  }
}

void ModelService::tick(uint64_t now_ms) {
  std::vector<uint32_t> late;
  for (const auto& [id, p] : pending_) {
    if (!p.failed && now_ms >= p.deadline_ms) late.push_back(id);
  }
  for (uint32_t id : late) {
    const Pending& p = pending_.at(id);
    fail_or_defer(id, {Code::Timeout, describe(p) + " timed out after " +
                                          std::to_string(now_ms - p.started_ms) + " ms (" +
                                          std::to_string(p.received) + " of " +
                                          std::to_string(p.bytes) + " bytes arrived)"});
  }
}

void ModelService::close(const Status& why) {
  if (!closed_) {
    closed_ = true;
    closed_why_ = why;
  }
  // The transports are closed: nothing writes into a buffer any more.
  while (!pending_.empty()) finish(pending_.begin()->first, why);
  for (Serving& s : serving_) s.waiting.clear();
}

Status ModelService::accept_frame(int src, const FrameHeader& h, const std::string& name,
                                  const uint8_t*, uint8_t** target) {
  *target = nullptr;
  if (h.type == MsgType::ModelRequest) return {};
  auto it = pending_.find(h.chunk);
  // A reply for a request that ended (its deadline passed) or that another rank holds.
  if (it == pending_.end() || it->second.rank != src || it->second.failed) {
    open_frames_[src].push_back(0);
    return {};
  }
  Pending& p = it->second;
  if (h.stage == kReplyError) {
    if (h.payload_len > kMaxReasonBytes) {
      return {Code::Protocol, "ModelReply error text of " + std::to_string(h.payload_len) +
                                  " bytes (at most " + std::to_string(kMaxReasonBytes) + ")"};
    }
    p.reason.assign(h.payload_len, '\0');
    *target = reinterpret_cast<uint8_t*>(p.reason.data());
  } else {
    if (h.count != p.bytes || name != p.name || h.offset > p.bytes || h.payload_len > p.bytes - h.offset) {
      return {Code::Protocol, "ModelReply for '" + name + "' of " + std::to_string(h.count) +
                                  " bytes, bytes " + std::to_string(h.offset) + "+" +
                                  std::to_string(h.payload_len) + ", does not fit request " +
                                  std::to_string(h.chunk) + " ('" + p.name + "', " +
                                  std::to_string(p.bytes) + " bytes)"};
    }
    *target = h.payload_len == 0 ? nullptr : p.buf + h.offset;
  }
  p.frames_open++;
  open_frames_[src].push_back(h.chunk);
  return {};
}

void ModelService::frame_done(int src, const FrameHeader& h, const std::string& name) {
  if (h.type == MsgType::ModelRequest) {
    if (down_[src]) return;
    Serving& s = serving_[src];
    Ask ask{h.chunk, name, h.op_version, h.count};
    if (s.waiting.size() >= kMaxWaitingRequests) {
      return reply_error(src, ask, {Code::NoMemory, "rank " + std::to_string(rank_) + " holds " +
                                                        std::to_string(kMaxWaitingRequests) +
                                                        " model requests of this rank already"});
    }
    s.waiting.push_back(std::move(ask));
    return pump(src);
  }
  if (open_frames_[src].empty()) return;
  const uint32_t id = open_frames_[src].front();
  open_frames_[src].pop_front();
  if (id == 0) return;
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  Pending& p = it->second;
  p.frames_open--;
  if (p.failed) {
    if (p.frames_open == 0) finish(id, p.failure);
    return;
  }
  if (h.stage == kReplyError) {
    const int32_t code = -static_cast<int32_t>(h.root);
    // Only an error's code may come back: anything else is the owner's bug, kept as text.
    const Code c = code < 0 && code_label(code) != nullptr ? static_cast<Code>(code) : Code::Protocol;
    return finish(id, {c, "rank " + std::to_string(src) + ": " + p.reason});
  }
  p.received += h.payload_len;
  if (p.received == p.bytes && p.frames_open == 0) finish(id, {});
}

void ModelService::link_down(int src, bool graceful, const Status& why) {
  down_[src] = true;
  serving_[src].waiting.clear();
  open_frames_[src].clear();
  std::vector<uint32_t> lost;
  for (const auto& [id, p] : pending_) {
    if (p.rank == src) lost.push_back(id);
  }
  for (uint32_t id : lost) {
    // The link is closed: its frames are no longer read into the buffer.
    finish(id, {Code::PeerLost, describe(pending_.at(id)) + ": rank " + std::to_string(src) +
                                    (graceful ? " finalized" : " was lost: " + why.message())});
  }
}

void ModelService::reply_error(int src, const Ask& ask, const Status& why) {
  // A requester that does not read its replies gets no more of them.
  if (transport_->queued_bytes(src) > kMaxQueuedForAnswer) return;
  OutMessage m;
  m.header.type = MsgType::ModelReply;
  m.header.stage = kReplyError;
  m.header.root = static_cast<uint32_t>(-static_cast<int32_t>(why.code()));
  m.header.op_version = ask.version;
  m.header.chunk = ask.id;
  m.name = ask.name;
  const std::string& text = why.message();
  m.owned.assign(text.begin(), text.begin() + static_cast<ptrdiff_t>(std::min<size_t>(text.size(), kMaxReasonBytes)));
  transport_->send(src, std::move(m));
}

void ModelService::pump(int src) {
  Serving& s = serving_[src];
  while (!s.sending && !s.waiting.empty() && !down_[src]) {
    Ask ask = std::move(s.waiting.front());
    s.waiting.pop_front();
    auto found = store_->find(ask.name, ask.version);
    if (!found.is_ok()) {
      reply_error(src, ask, found.status());
      continue;
    }
    const ModelVersion model = found.value();
    const uint64_t size = model.bytes->size();
    if (size != ask.bytes) {
      reply_error(src, ask, {Code::Mismatch, "model '" + ask.name + "' version " +
                                                 std::to_string(model.version) + " is " +
                                                 std::to_string(size) + " bytes; the request's buffer is " +
                                                 std::to_string(ask.bytes) + " bytes"});
      continue;
    }
    // Every chunk borrows the stored bytes; the last one sent lets the next reply start.
    const uint64_t chunks = size == 0 ? 1 : (size + chunk_bytes_ - 1) / chunk_bytes_;
    auto left = std::make_shared<uint64_t>(chunks);
    s.sending = true;
    for (uint64_t i = 0; i < chunks; ++i) {
      const uint64_t offset = i * chunk_bytes_;
      OutMessage m;
      m.header.type = MsgType::ModelReply;
      m.header.stage = kReplyData;
      m.header.op_version = model.version;
      m.header.count = size;
      m.header.chunk = ask.id;
      m.header.offset = offset;
      m.name = ask.name;
      m.payload = model.bytes->data() + offset;
      m.payload_len = std::min(chunk_bytes_, size - offset);
      m.on_sent = [this, src, left, keep = model.bytes](const Status&) {
        if (--*left != 0) return;
        serving_[src].sending = false;
        pump(src);
      };
      transport_->send(src, std::move(m));
    }
  }
}

}  // namespace taiji
