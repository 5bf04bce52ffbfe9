#include "runtime/p2p_key.h"

namespace taiji {

namespace {

constexpr std::string_view kPrefix = "taiji.p2p/";

}  // namespace

std::string p2p_key(std::string_view name, int src, int dst) {
  std::string key(kPrefix);
  key += std::to_string(src) + ">" + std::to_string(dst) + "/";
  key += name;
  return key;
}

std::string_view p2p_user_name(std::string_view key) {
  if (key.substr(0, kPrefix.size()) != kPrefix) return key;
  const size_t slash = key.find('/', kPrefix.size());
  return slash == std::string_view::npos ? key : key.substr(slash + 1);
}

}  // namespace taiji
