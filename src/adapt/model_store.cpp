#include "adapt/model_store.h"

#include <cstring>

namespace taiji {

namespace {

std::string kept_versions(const std::vector<ModelVersion>& versions) {
  std::string out;
  for (const ModelVersion& v : versions) out += (out.empty() ? "" : ", ") + std::to_string(v.version);
  return out;
}

}  // namespace

Result<uint64_t> ModelStore::save(const std::string& name, const void* data, uint64_t bytes,
                                  uint64_t version) {
  // The copy is made before the lock: a large model must not hold up the I/O thread's lookups.
  auto blob = std::make_shared<std::vector<uint8_t>>(bytes);
  if (bytes != 0) std::memcpy(blob->data(), data, bytes);

  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(name);
  const uint64_t latest = it == models_.end() || it->second.empty() ? 0 : it->second.back().version;
  if (version == 0) {
    if (latest == UINT64_MAX) return Status{Code::InvalidArgument, "model '" + name + "' has no version left after " + std::to_string(latest)};
    version = latest + 1;
  } else if (version <= latest) {
    return Status{Code::StaleVersion, "model '" + name + "': version " + std::to_string(version) +
                                          " is not above the latest kept, " + std::to_string(latest)};
  }
  const uint64_t freed = it != models_.end() && it->second.size() >= keep_ ? it->second.front().bytes->size() : 0;
  if (held_ - freed + bytes > max_bytes_ || bytes > max_bytes_) {
    return Status{Code::NoMemory, "model '" + name + "': saving " + std::to_string(bytes) +
                                      " bytes would pass the store's bound (TAIJI_MODEL_STORE_BYTES) of " +
                                      std::to_string(max_bytes_) + " bytes; it holds " +
                                      std::to_string(held_) + " bytes"};
  }
  std::vector<ModelVersion>& versions = models_[name];
  versions.push_back({version, std::move(blob)});
  held_ += bytes;
  while (versions.size() > keep_) {
    held_ -= versions.front().bytes->size();
    versions.erase(versions.begin());
  }
  return version;
}

Result<ModelVersion> ModelStore::find(const std::string& name, uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(name);
  if (it == models_.end() || it->second.empty()) {
    return Status{Code::NotFound, "no model '" + name + "' was saved"};
  }
  const std::vector<ModelVersion>& versions = it->second;
  if (version == 0) return versions.back();
  for (const ModelVersion& v : versions) {
    if (v.version == version) return v;
  }
  return Status{Code::NotFound, "model '" + name + "' has no version " + std::to_string(version) +
                                    " (kept: " + kept_versions(versions) + ")"};
}

uint64_t ModelStore::bytes_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

}  // namespace taiji
