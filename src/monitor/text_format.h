// Small writers for the two text formats the monitor emits: JSON (snapshots, the flight
// recorder) and the Prometheus text exposition format. Appending to one string keeps a
// snapshot to a handful of allocations.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace taiji {

// A JSON string literal, quotes included; control characters and invalid UTF-8 bytes
// are escaped (the latter as \u00XX) so that any op name yields valid JSON.
void append_json_string(std::string& out, std::string_view s);
// A JSON number; non-finite values become null (JSON has no NaN or infinity).
void append_json_number(std::string& out, double v);
void append_json_number(std::string& out, uint64_t v);

// A Prometheus label value between quotes: backslash, quote and newline escaped, and each
// byte that is not UTF-8 (as append_json_string judges it) replaced by U+FFFD.
void append_label_value(std::string& out, std::string_view s);
// A Prometheus sample value: integers exactly, others with 9 significant digits, +Inf.
void append_sample_value(std::string& out, double v);
void append_sample_value(std::string& out, uint64_t v);

// [a-zA-Z_:][a-zA-Z0-9_:]* (metric names) or, with colon false, a label name.
bool valid_metric_name(std::string_view s, bool colon = true);

}  // namespace taiji
