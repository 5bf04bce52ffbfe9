#include "runtime/early_arrivals.h"

#include <algorithm>

#include "monitor/log.h"

namespace taiji {

namespace {

// What one held item costs against the cap beyond its payload and its op's name, so that
// a flood of empty frames for unposted ops is bounded too.
constexpr uint64_t kItemCost = 128;

uint64_t item_cost(const std::string& name) { return kItemCost + name.size(); }

}  // namespace

EarlyArrivals::EarlyArrivals(EarlyArrivalOptions options)
    : opt_(std::move(options)), rx_(opt_.size, nullptr) {}

Status EarlyArrivals::abort_for(const Key& key) const {
  auto it = held_.find(key);
  return it == held_.end() ? Status{} : it->second.abort;
}

void EarlyArrivals::hold_ready(int src, const Key& key, const FrameHeader& h) {
  held_[key].readies.push_back(h);
  charge(src, item_cost(key.first));
}

void EarlyArrivals::hold_abort(int src, const Key& key, const Status& why) {
  Entry& e = held_[key];
  if (!e.abort.is_ok()) release(item_cost(key.first) + e.abort.message().size());
  e.abort = why;
  charge(src, item_cost(key.first) + why.message().size());
}

Status EarlyArrivals::begin_data(int src, const Key& key, const FrameHeader& h, uint8_t** target) {
  if (h.payload_len > opt_.max_payload) {
    return {Code::Protocol, "early data for '" + key.first + "' version " + std::to_string(key.second) +
                                " of " + std::to_string(h.payload_len) +
                                " bytes exceeds the early-arrival cap " + std::to_string(opt_.cap_bytes)};
  }
  auto data = std::make_unique<Data>();
  data->header = h;
  data->payload.resize(h.payload_len);
  *target = data->payload.data();
  rx_[src] = data.get();
  held_[key].data.push_back(std::move(data));
  // Counted now, paused (if over the cap) once the payload is in: complete().
  hold_bytes(h.payload_len + item_cost(key.first));
  return {};
}

std::unique_ptr<EarlyArrivals::Data> EarlyArrivals::complete(int src, const Key& key, bool keep) {
  Data* data = rx_[src];
  rx_[src] = nullptr;
  data->complete = true;
  if (keep) {
    charge(src, 0);
    return nullptr;
  }
  return unlink(held_.find(key), data);
}

EarlyArrivals::Claimed EarlyArrivals::claim(const Key& key) {
  Claimed out;
  auto it = held_.find(key);
  if (it == held_.end()) return out;
  out.readies = std::exchange(it->second.readies, {});
  auto& list = it->second.data;
  for (auto d = list.begin(); d != list.end();) {
    if ((*d)->complete) {
      out.data.push_back(std::move(*d));
      d = list.erase(d);
    } else {
      ++d;  // still arriving: complete() hands it over
    }
  }
  if (list.empty()) held_.erase(it);
  uint64_t bytes = out.readies.size() * item_cost(key.first);
  for (const auto& d : out.data) bytes += d->payload.size() + item_cost(key.first);
  release(bytes);
  return out;
}

void EarlyArrivals::discard(const Key& key) {
  auto it = held_.find(key);
  if (it == held_.end()) return;
  Entry& e = it->second;
  const uint64_t item = item_cost(key.first);
  uint64_t bytes = e.readies.size() * item + (e.abort.is_ok() ? 0 : item + e.abort.message().size());
  e.readies.clear();
  e.abort = Status{};
  for (auto d = e.data.begin(); d != e.data.end();) {
    if ((*d)->complete) {
      bytes += (*d)->payload.size() + item;
      d = e.data.erase(d);
    } else {
      ++d;  // its frame is still being read into it; complete() frees it
    }
  }
  if (e.data.empty()) held_.erase(it);
  release(bytes);
}

void EarlyArrivals::discard_if(const std::function<bool(const Key&)>& pred) {
  std::vector<Key> keys;
  for (const auto& [key, entry] : held_) {
    if (pred(key)) keys.push_back(key);
  }
  for (const Key& key : keys) discard(key);
}

void EarlyArrivals::drop_partial(int src) {
  Data* partial = rx_[src];
  if (partial == nullptr) return;
  rx_[src] = nullptr;
  // Its key is not at hand here; a link goes down rarely enough to look through them all.
  for (auto e = held_.begin(); e != held_.end(); ++e) {
    if (unlink(e, partial)) return;
  }
}

void EarlyArrivals::abandon_partials() { std::fill(rx_.begin(), rx_.end(), nullptr); }

void EarlyArrivals::hold_bytes(uint64_t bytes) {
  bytes_ += bytes;
  if (opt_.metrics != nullptr) opt_.metrics->note_early_bytes(bytes_);
}

void EarlyArrivals::charge(int src, uint64_t bytes) {
  hold_bytes(bytes);
  if (bytes_ > opt_.cap_bytes && paused_.insert(src).second) {
    log().info("early-arrival buffer full ({} bytes); pausing reads from rank {}", bytes_, src);
    if (opt_.metrics != nullptr) opt_.metrics->link_counters()[src].add_read_pause();
    opt_.pause_reading(src);
  }
}

void EarlyArrivals::release(uint64_t bytes) {
  bytes_ -= bytes;
  if (bytes_ > opt_.cap_bytes || paused_.empty()) return;
  for (int src : paused_) opt_.resume_reading(src);
  paused_.clear();
}

std::unique_ptr<EarlyArrivals::Data> EarlyArrivals::unlink(std::map<Key, Entry>::iterator e,
                                                          const Data* item) {
  auto& list = e->second.data;
  auto pos = std::find_if(list.begin(), list.end(), [&](const auto& d) { return d.get() == item; });
  if (pos == list.end()) return nullptr;
  std::unique_ptr<Data> mine = std::move(*pos);
  const uint64_t bytes = mine->payload.size() + item_cost(e->first.first);
  list.erase(pos);
  if (list.empty() && e->second.readies.empty() && e->second.abort.is_ok()) held_.erase(e);
  release(bytes);
  return mine;
}

}  // namespace taiji
