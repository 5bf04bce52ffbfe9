// Settings by key: taiji_config_set keeps the text of each key, checked by the parser of
// runtime/settings.h, and taiji_peer_init applies them over the struct's fields.
#include <taiji/taiji.h>

#include <cstddef>
#include <map>
#include <memory>
#include <new>
#include <string>

#include "runtime/settings.h"

#include "handles.h"

struct taiji_settings {
  std::map<std::string, std::string> values;  // key -> value, as the caller gave them
};

namespace {

// A struct from a header older than taiji_config_set has no room for the settings pointer.
constexpr size_t kSettingsEnd = offsetof(taiji_config_t, settings) + sizeof(taiji_settings_t*);

taiji_status_t refuse(taiji_status_t code, std::string message) {
  taiji_capi::init_error = std::move(message);
  return code;
}

}  // namespace

namespace taiji_capi {

bool has_settings_field(const taiji_config_t* config) {
  return config->struct_size >= kSettingsEnd && config->struct_size <= (1u << 16);
}

taiji::Status apply_settings(const taiji_config_t& config, taiji::Config* out) {
  if (config.settings == nullptr) return {};
  for (const auto& [key, value] : config.settings->values) {
    const taiji::Setting* s = taiji::find_setting(key);
    if (s == nullptr) return {taiji::Code::InvalidArgument, "unknown configuration key '" + key + "'"};
    taiji::Status st = taiji::parse_setting(*s, value, out);
    if (!st.is_ok()) return {taiji::Code::InvalidArgument, st.message()};
  }
  return {};
}

}  // namespace taiji_capi

extern "C" {

taiji_status_t taiji_config_set(taiji_config_t* config, const char* key, const char* value) {
  taiji_capi::init_error.clear();
  if (config == nullptr) return refuse(TAIJI_ERR_INVALID_ARGUMENT, "config is NULL");
  if (key == nullptr) return refuse(TAIJI_ERR_INVALID_ARGUMENT, "key is NULL");
  if (!taiji_capi::has_settings_field(config)) {
    return refuse(TAIJI_ERR_INVALID_ARGUMENT,
                  "config.struct_size has no room for settings (use TAIJI_CONFIG_INIT)");
  }
  try {
    const taiji::Setting* s = taiji::find_setting(key);
    if (s == nullptr) {
      return refuse(TAIJI_ERR_INVALID_ARGUMENT,
                    "unknown configuration key '" + std::string(key) +
                        "' (the keys are the variables of docs/environment.md)");
    }
    const std::string name(s->name);
    if (value == nullptr || *value == '\0') {
      if (config->settings != nullptr) config->settings->values.erase(name);
      return TAIJI_OK;
    }
    taiji::Config scratch;
    if (taiji::Status st = taiji::parse_setting(*s, value, &scratch); !st.is_ok()) {
      return refuse(TAIJI_ERR_INVALID_ARGUMENT, st.message());
    }
    // Allocated aside so that running out of memory leaves the config as it was.
    std::unique_ptr<taiji_settings> fresh;
    if (config->settings == nullptr) fresh = std::make_unique<taiji_settings>();
    taiji_settings* into = fresh ? fresh.get() : config->settings;
    into->values[name] = value;
    if (fresh) config->settings = fresh.release();
    return TAIJI_OK;
  } catch (const std::bad_alloc&) {
    return refuse(TAIJI_ERR_NO_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return refuse(TAIJI_ERR_INTERNAL, e.what());
  }
}

void taiji_config_clear(taiji_config_t* config) {
  if (config == nullptr || !taiji_capi::has_settings_field(config)) return;
  delete config->settings;
  config->settings = nullptr;
}

}  // extern "C"
