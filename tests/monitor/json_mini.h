// A small JSON reader for checking the monitor's snapshots in tests: it parses the whole
// text (so a test also proves the output is valid JSON) into a tree of values.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace taiji_test {

struct Json {
  enum class Type { Null, Bool, Number, String, Array, Object } type = Type::Null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::map<std::string, Json> object;

  // Member access that throws on a missing key, so a test names what is absent.
  const Json& operator[](const std::string& key) const {
    auto it = object.find(key);
    if (type != Type::Object || it == object.end()) throw std::runtime_error("no key '" + key + "'");
    return it->second;
  }
  const Json& operator[](size_t i) const {
    if (type != Type::Array || i >= array.size()) throw std::runtime_error("no index " + std::to_string(i));
    return array[i];
  }
  bool has(const std::string& key) const { return type == Type::Object && object.count(key) > 0; }
  uint64_t u64() const { return static_cast<uint64_t>(number); }
};

// Throws std::runtime_error on invalid JSON or trailing text.
Json parse_json(const std::string& text);

}  // namespace taiji_test
