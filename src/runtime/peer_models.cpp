// The peer's model store: saves go into the store on the calling thread; requests for
// another rank's model go to the I/O thread, where the model service sends them and
// reads the reply into the caller's buffer (runtime/model_service.h).
#include <cstring>

#include "common/time_limit.h"
#include "runtime/peer.h"

namespace taiji {

Status Peer::check_model_name(const std::string& name) const {
  if (name.empty()) return {Code::InvalidArgument, "model name is empty"};
  if (name.size() > config_.max_name_len) {
    return {Code::InvalidArgument, "model name of " + std::to_string(name.size()) +
                                       " bytes is longer than TAIJI_MAX_NAME_LEN " +
                                       std::to_string(config_.max_name_len)};
  }
  if (name.rfind("taiji.", 0) == 0) return {Code::InvalidArgument, "names starting with 'taiji.' are reserved"};
  return {};
}

Result<uint64_t> Peer::model_save(const std::string& name, const void* data, uint64_t bytes,
                                  uint64_t version) {
  if (Status s = check_model_name(name); !s.is_ok()) return s;
  if (data == nullptr && bytes != 0) return Status{Code::InvalidArgument, "model buffer is NULL"};
  if (closed()) return Status{Code::Finalized, "peer is finalized or aborted"};
  return models_->save(name, data, bytes, version);
}

Result<std::shared_ptr<RequestState>> Peer::model_request(int rank, const std::string& name,
                                                          uint64_t version, void* buf, uint64_t bytes,
                                                          int64_t timeout_ms,
                                                          RequestState::Callback callback) {
  if (Status s = check_model_name(name); !s.is_ok()) return s;
  if (rank < 0 || rank >= size()) {
    return Status{Code::InvalidArgument, "rank " + std::to_string(rank) + " is not in 0.." +
                                             std::to_string(size() - 1)};
  }
  if (buf == nullptr && bytes != 0) return Status{Code::InvalidArgument, "model buffer is NULL"};
  if (timeout_ms < 0) return Status{Code::InvalidArgument, "timeout_ms is negative"};
  if (closed()) return Status{Code::Finalized, "peer is finalized or aborted"};
  auto state = std::make_shared<RequestState>(version, std::move(callback));
  if (io_.adaptive()) state->set_spin(io_.spin_ns(), io_.baton());
  auto* out = static_cast<uint8_t*>(buf);

  if (rank == this->rank()) {
    // Served here and now; the completion still goes through the loop, where callbacks run.
    Status result;
    auto found = models_->find(name, version);
    if (!found.is_ok()) {
      result = found.status();
    } else if (found.value().bytes->size() != bytes) {
      result = {Code::Mismatch, "model '" + name + "' version " + std::to_string(found.value().version) +
                                    " is " + std::to_string(found.value().bytes->size()) +
                                    " bytes; the request's buffer is " + std::to_string(bytes) + " bytes"};
    } else if (bytes != 0) {
      std::memcpy(out, found.value().bytes->data(), bytes);
    }
    if (!run_on_loop([state, result] { state->complete(result); })) state->complete(result);
    return state;
  }

  const int64_t limit = timeout_ms == 0 ? config_.timeout_ms : clamp_timeout_ms(timeout_ms);
  if (!run_on_loop([this, state, rank, name, version, out, bytes, limit] {
        const uint64_t now = uv_now(io_.uv());
        model_service_->start(rank, name, version, out, bytes, now, now + static_cast<uint64_t>(limit), state);
      })) {
    return Status{Code::Finalized, "peer is finalized or aborted"};
  }
  return state;
}

}  // namespace taiji
