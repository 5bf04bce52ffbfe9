// The table of settings: each variable taiji reads for itself, the Config field it fills,
// how its text is parsed and checked, its default and its documentation. resolve_config,
// taiji_config_set and the check of docs/environment.md all read this one table, so a
// setting cannot be parsed one way from the environment and another way from the C API.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "common/status.h"
#include "runtime/config.h"

namespace taiji {

enum class SettingType {
  Integer,  // decimal digits only, in min..max
  Bytes,    // digits with an optional K, M or G suffix (powers of 1024), positive
  Millis,   // a positive integer of milliseconds; more than a year counts as a year
  Switch,   // one of `words`, stored as 0 or 1 in an int that is -1 while unset
  String,   // any text, checked by `check` where one is given
  Enum,     // one of `words`, stored as the word
};

// A word a Switch or Enum accepts and, for a Switch, the value it stands for.
struct SettingWord {
  std::string_view text;
  int value = 0;
};

using SettingField = std::variant<int Config::*, int64_t Config::*, uint32_t Config::*,
                                  uint64_t Config::*, std::string Config::*>;

struct Setting {
  std::string_view name;   // the environment variable, and the key of taiji_config_set
  std::string_view field;  // the Config field: errors about explicit values name it
  SettingType type;
  SettingField member;
  // Numbers: the field's value while nothing set it (strings: empty).
  int64_t unset = 0;
  // Integer, Millis: what the variable accepts (min 0 or 1). Bytes: the bounds of the
  // resolved value from any source, 0 and UINT64_MAX meaning none.
  uint64_t min = 0;
  uint64_t max = 0;
  std::span<const SettingWord> words = {};
  // What errors call it ("chunk size"); for a Switch, what -1 stands for ("auto").
  std::string_view what = {};
  std::string_view bound_why = {};  // why the bounds are what they are, for their error
  // String: "" when the value is acceptable, else why not ("is not host:port: ...").
  std::string (*check)(const std::string& value) = nullptr;
  // The default as text parsed like a value; empty: none, or computed by `computed_default`.
  std::string_view def = {};
  std::string (*computed_default)(const Config& c, const EnvLookup& env) = nullptr;
  // The default as docs/environment.md shows it, where "`def`" would not say it.
  std::string_view def_doc = {};
  std::string_view doc = {};  // the Meaning cell of docs/environment.md, verbatim
  // Read by the rank, world size and rendezvous rules, which also consult other launchers'
  // variables, rather than by the generic pass over the table.
  bool resolved_apart = false;
};

std::span<const Setting> settings();
// nullptr when no setting has that name.
const Setting* find_setting(std::string_view name);

// Parses `value` as setting `s` takes it and stores it in its field of `*c`. Errors
// (Code::Config) name the variable and the value, as the environment's errors do.
Status parse_setting(const Setting& s, std::string_view value, Config* c);

// Checks a value that did not come through parse_setting (an explicit field or a default)
// against the setting's rules, and clamps a timeout past a year to a year; `source` says
// where the value came from, for the error.
Status check_resolved(const Setting& s, Config* c, const std::string& source);

// True when the field of `s` in `c` holds a value (is not its unset value).
bool is_set(const Setting& s, const Config& c);

// "field=value" for numbers, "'value'" for strings: how errors quote a resolved value.
std::string value_source(const Setting& s, const Config& c);

// The variable and its text as errors quote them: TAIJI_X='value'.
std::string named(std::string_view var, std::string_view value);

Status config_error(std::string message);

// Integer variables: `min` is 0 or 1 and picks the wording of the error.
Status parse_int(std::string_view var, std::string_view value, uint64_t min, uint64_t max,
                 uint64_t* out);

}  // namespace taiji
