#include "device/sequencer.h"

#include <algorithm>
#include <set>

#include "device/sequencer_wire.h"

namespace taiji {

namespace w = seq_wire;

namespace {

// Enough for the announcements of one round still on their way when an op is withdrawn.
constexpr size_t kWithdrawnMemory = 4096;

Status protocol(const std::string& what) { return {Code::Protocol, "sequencer: " + what}; }

// "rank 2", "ranks 0,1", "ranks 0-3,5": sorted ranks, runs of three or more as ranges.
std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) s += ',';
    s += std::to_string(ranks[i]);
    if (j == i + 1) s += ',' + std::to_string(ranks[j]);
    if (j > i + 1) s += '-' + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

std::string op_text(const std::string& name, uint64_t version) {
  return "'" + name + "' version " + std::to_string(version);
}

// A why travels with a u16 length; a job of thousands of ranks that disagree many ways
// is named in its first few kilobytes.
std::string clip(std::string why) {
  if (why.size() > w::kMaxWhy) {
    why.resize(w::kMaxWhy - 3);
    why += "...";
  }
  return why;
}

}  // namespace

std::string describe(const DeviceOpSpec& spec) {
  std::string s = std::string(op_kind_name(spec.kind)) + " " + std::string(dtype_name(spec.dtype));
  if (op_kind_reduces(spec.kind)) s += " " + std::string(redop_name(spec.redop));
  s += " count " + std::to_string(spec.count);
  if (op_kind_rooted(spec.kind)) s += " root " + std::to_string(spec.root);
  return s;
}

// Names longer than kMaxName never get here: the runtime caps max_name_len at 65535. One
// that did would not be announced, and its op would end by its own timeout.
void SequencerClient::announce(const std::string& name, uint64_t version, const DeviceOpSpec& spec,
                               std::vector<uint8_t>& msg) {
  if (name.size() > w::kMaxName) return;
  const DeviceOpSpec s = w::canonical(spec);
  if (auto it = ids_.find(w::def_key(name, s)); it != ids_.end()) {
    w::begin_record(msg, w::AnnounceId);
    w::put_u32(msg, it->second);
    w::put_u64(msg, version);
    return;
  }
  w::begin_record(msg, w::AnnounceFull);
  w::put_text(msg, name);
  w::put_u64(msg, version);
  w::put_spec(msg, s);
}

void SequencerClient::withdraw(const std::string& name, uint64_t version, std::vector<uint8_t>& msg) {
  if (name.size() > w::kMaxName) return;
  w::begin_record(msg, w::Withdraw);
  w::put_text(msg, name);
  w::put_u64(msg, version);
}

Result<std::vector<OrderEntry>> SequencerClient::read_order(const uint8_t* data, size_t size) {
  w::Reader r(data, size);
  if (r.u8() != w::kFormat) return protocol("order message of an unknown format");
  const uint32_t records = r.u32();
  std::vector<OrderEntry> entries;
  // Definitions are kept aside until the whole message has been read: a bad message
  // teaches nothing.
  std::vector<std::pair<std::string, std::string>> defs;  // (key, name); ids follow names_
  std::set<std::string> def_keys;
  for (uint32_t i = 0; i < records && !r.bad(); ++i) {
    OrderEntry e;
    const uint8_t tag = r.u8();
    if (tag == w::RunDefine) {
      const uint32_t id = r.u32();
      e.version = r.u64();
      e.name = r.text();
      const DeviceOpSpec spec = r.spec();
      if (r.bad()) break;
      if (id != names_.size() + defs.size()) {
        return protocol("definition of id " + std::to_string(id) + " out of order");
      }
      std::string key = w::def_key(e.name, spec);
      if (ids_.count(key) != 0 || !def_keys.insert(key).second) {
        return protocol("second id for " + op_text(e.name, e.version));
      }
      defs.emplace_back(std::move(key), e.name);
    } else if (tag == w::RunId) {
      const uint32_t id = r.u32();
      e.version = r.u64();
      if (r.bad()) break;
      if (auto it = names_.find(id); it != names_.end()) {
        e.name = it->second;
      } else if (id >= names_.size() && id - names_.size() < defs.size()) {
        e.name = defs[id - names_.size()].second;
      } else {
        return protocol("order by unknown id " + std::to_string(id));
      }
    } else if (tag == w::RunFull || tag == w::Mismatch || tag == w::Withdrawn) {
      e.name = r.text();
      e.version = r.u64();
      if (tag != w::RunFull) {
        e.verdict = tag == w::Mismatch ? OrderEntry::Verdict::Mismatch : OrderEntry::Verdict::Withdrawn;
        e.why = r.text();
      }
    } else {
      return protocol("order record of unknown type " + std::to_string(tag));
    }
    entries.push_back(std::move(e));
  }
  if (r.bad() || !r.at_end()) return protocol("order message cut short or overlong");
  for (auto& [key, name] : defs) {
    const auto id = static_cast<uint32_t>(names_.size());
    ids_.emplace(std::move(key), id);
    names_.emplace(id, std::move(name));
  }
  return entries;
}

Sequencer::Sequencer(int size) : size_(size) {}

Status Sequencer::receive(int rank, const uint8_t* data, size_t size) {
  if (rank < 0 || rank >= size_) {
    return {Code::InvalidArgument, "sequencer: rank " + std::to_string(rank) + " of " + std::to_string(size_)};
  }
  auto bad = [rank](const std::string& what) { return protocol("rank " + std::to_string(rank) + ": " + what); };
  struct Record {
    bool withdraw = false;
    std::string name;
    uint64_t version = 0;
    DeviceOpSpec spec;
  };
  // Read and check the whole message before applying any of it.
  w::Reader r(data, size);
  if (r.u8() != w::kFormat) return bad("message of an unknown format");
  const uint32_t count = r.u32();
  std::vector<Record> records;
  std::set<Key> announced_here;
  for (uint32_t i = 0; i < count && !r.bad(); ++i) {
    Record rec;
    const uint8_t tag = r.u8();
    if (tag == w::AnnounceFull) {
      rec.name = r.text();
      rec.version = r.u64();
      rec.spec = r.spec();
    } else if (tag == w::AnnounceId) {
      const uint32_t id = r.u32();
      rec.version = r.u64();
      if (r.bad()) break;
      if (id >= defs_.size()) return bad("announcement by unknown id " + std::to_string(id));
      rec.name = defs_[id].name;
      rec.spec = defs_[id].spec;
    } else if (tag == w::Withdraw) {
      rec.withdraw = true;
      rec.name = r.text();
      rec.version = r.u64();
    } else {
      return bad("record of unknown type " + std::to_string(tag));
    }
    if (r.bad()) break;
    if (!rec.withdraw) {
      Key key{rec.name, rec.version};
      auto it = pending_.find(key);
      if ((it != pending_.end() && it->second.posted[rank]) || !announced_here.insert(std::move(key)).second) {
        return bad("announced " + op_text(rec.name, rec.version) + " twice");
      }
    }
    records.push_back(std::move(rec));
  }
  if (r.bad() || !r.at_end()) return bad("message cut short or overlong");
  for (const Record& rec : records) {
    if (rec.withdraw) {
      withdrawn(rank, rec.name, rec.version);
    } else {
      announced(rank, rec.name, rec.version, rec.spec);
    }
  }
  return Status::ok();
}

std::vector<uint8_t> Sequencer::take_order() { return std::exchange(out_, {}); }

size_t Sequencer::pending() const { return pending_.size(); }

size_t Sequencer::cached() const { return defs_.size(); }

void Sequencer::announced(int rank, const std::string& name, uint64_t version, const DeviceOpSpec& spec) {
  Key key{name, version};
  if (auto wd = withdrawn_.find(key); wd != withdrawn_.end()) {
    emit_failed(w::Withdrawn, key,
                "rank " + std::to_string(wd->second) +
                    " withdrew it (timed out) before every rank had posted it; rank " + std::to_string(rank) +
                    " posted it after");
    return;
  }
  auto [it, fresh] = pending_.try_emplace(std::move(key));
  Pending& p = it->second;
  if (fresh) {
    p.posted.assign(size_, false);
    p.spec = spec;
  } else if (!(spec == p.spec)) {
    p.differ.emplace_back(rank, spec);
  }
  p.posted[rank] = true;
  if (++p.count < size_) return;
  decide(it->first, p);
  pending_.erase(it);
}

// An op no longer pending was ordered or withdrawn before this arrived, and its entry is on
// its way to the rank (links are FIFO): nothing to undo. One pending that this rank has not
// announced is a later op of the same name and version than the one it gave up on.
void Sequencer::withdrawn(int rank, const std::string& name, uint64_t version) {
  auto it = pending_.find(Key{name, version});
  if (it == pending_.end() || !it->second.posted[rank]) return;
  std::vector<int> posted;
  for (int r = 0; r < size_; ++r) {
    if (it->second.posted[r]) posted.push_back(r);
  }
  emit_failed(w::Withdrawn, it->first,
              "rank " + std::to_string(rank) + " withdrew it (timed out) before every rank had posted it; " +
                  "posted by " + ranks_text(posted));
  remember_withdrawn(it->first, rank);
  pending_.erase(it);
}

void Sequencer::decide(const Key& key, const Pending& p) {
  if (p.differ.empty()) {
    emit_run(key, p.spec);
    return;
  }
  // Ranks grouped by the spec they announced, in the order of each group's lowest rank.
  std::vector<std::pair<DeviceOpSpec, std::vector<int>>> groups{{p.spec, {}}};
  std::vector<bool> differs(size_, false);
  for (const auto& [rank, spec] : p.differ) {
    differs[rank] = true;
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == spec; });
    if (g == groups.end()) g = groups.insert(groups.end(), {spec, {}});
    g->second.push_back(rank);
  }
  for (int r = 0; r < size_; ++r) {
    if (!differs[r]) groups[0].second.push_back(r);
  }
  for (auto& g : groups) std::sort(g.second.begin(), g.second.end());
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.second[0] < b.second[0]; });
  std::string why = "ranks disagree on " + op_text(key.first, key.second) + ":";
  for (size_t i = 0; i < groups.size(); ++i) {
    why += (i == 0 ? " " : ", ") + ranks_text(groups[i].second) + " " + describe(groups[i].first);
  }
  emit_failed(w::Mismatch, key, why);
}

void Sequencer::emit_run(const Key& key, const DeviceOpSpec& spec) {
  std::string def = w::def_key(key.first, spec);
  if (auto it = ids_.find(def); it != ids_.end()) {
    w::begin_record(out_, w::RunId);
    w::put_u32(out_, it->second);
    w::put_u64(out_, key.second);
    return;
  }
  if (defs_.size() < w::kMaxIds) {
    const auto id = static_cast<uint32_t>(defs_.size());
    defs_.push_back({key.first, spec});
    ids_.emplace(std::move(def), id);
    w::begin_record(out_, w::RunDefine);
    w::put_u32(out_, id);
    w::put_u64(out_, key.second);
    w::put_text(out_, key.first);
    w::put_spec(out_, spec);
    return;
  }
  w::begin_record(out_, w::RunFull);
  w::put_text(out_, key.first);
  w::put_u64(out_, key.second);
}

void Sequencer::emit_failed(uint8_t tag, const Key& key, const std::string& why) {
  w::begin_record(out_, tag);
  w::put_text(out_, key.first);
  w::put_u64(out_, key.second);
  w::put_text(out_, clip(why));
}

void Sequencer::remember_withdrawn(const Key& key, int rank) {
  if (!withdrawn_.emplace(key, rank).second) return;
  withdrawn_order_.push_back(key);
  if (withdrawn_order_.size() > kWithdrawnMemory) {
    withdrawn_.erase(withdrawn_order_.front());
    withdrawn_order_.pop_front();
  }
}

}  // namespace taiji
