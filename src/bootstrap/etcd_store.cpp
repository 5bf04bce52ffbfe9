#include "bootstrap/etcd_store.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace taiji {

namespace {

using Clock = std::chrono::steady_clock;

// The least time one request gets, however close its call's deadline is.
constexpr int64_t kMinRequestMs = 250;

// The gateway's answers hold a header, a key and a value or two: far below this.
constexpr size_t kMaxReplyBytes = 4 * kRendezvousMaxValue;

std::string base64(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(std::max(n, 0)));
  return out;
}

std::optional<std::string> unbase64(const std::string& text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out(3 * text.size() / 4, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  // EVP_DecodeBlock counts the padding as zero bytes.
  size_t pad = 0;
  while (pad < 2 && pad < text.size() && text[text.size() - 1 - pad] == '=') ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

// The string value of "field" at or after `from` in a gateway reply. Keys and values are
// base64 and numbers are digits, so no field read here holds a quote or an escape.
std::optional<std::string> field(const std::string& json, const std::string& name, size_t from = 0) {
  const std::string tag = "\"" + name + "\":\"";
  size_t at = json.find(tag, from);
  if (at == std::string::npos) return std::nullopt;
  at += tag.size();
  size_t end = json.find('"', at);
  if (end == std::string::npos) return std::nullopt;
  return json.substr(at, end - at);
}

size_t collect(char* data, size_t size, size_t n, void* user) {
  auto* body = static_cast<std::string*>(user);
  if (body->size() + size * n > kMaxReplyBytes) return 0;  // curl then fails the transfer
  body->append(data, size * n);
  return size * n;
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

int64_t left_ms(Clock::time_point deadline) {
  return std::max<int64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count(), 0);
}

// A key as the gateway sees it: present or not, its value and its last revision.
struct Entry {
  bool present = false;
  std::string value;
  std::string mod_revision;
};

}  // namespace

struct EtcdStore::Impl {
  std::string endpoint;  // "http://HOST:PORT"
  std::string prefix;    // "PREFIX/" or empty
  std::string address;   // as given, for messages
  CURL* curl = nullptr;

  ~Impl() {
    if (curl != nullptr) curl_easy_cleanup(curl);
  }

  std::string where() const { return "etcd " + address; }

  // POSTs `body` to the gateway's `path` and returns the reply's body.
  Result<std::string> post(const std::string& path, const std::string& body, int64_t timeout_ms,
                           const std::string& what) {
    std::string reply;
    curl_easy_reset(curl);
    const std::string url = endpoint + path;
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_PROXY, "");  // a proxy from the environment is never wanted here
    const long ms = static_cast<long>(std::clamp<int64_t>(timeout_ms, 1, 24LL * 3600 * 1000));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, ms);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, ms);
    CURLcode rc = curl_easy_perform(curl);
    if (rc != CURLE_OK) {
      return Status(Code::Bootstrap, where() + ": " + what + ": " + curl_easy_strerror(rc));
    }
    long http = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
    if (http != 200) {
      return Status(Code::Bootstrap, where() + ": " + what + ": HTTP " + std::to_string(http) + ": " +
                                         reply.substr(0, 200));
    }
    return reply;
  }

  std::string key_json(const std::string& key) const { return "\"key\":\"" + base64(prefix + key) + "\""; }

  Result<Entry> read(const std::string& key, int64_t timeout_ms) {
    auto reply = post("/v3/kv/range", "{" + key_json(key) + "}", timeout_ms, "get '" + key + "'");
    if (!reply.is_ok()) return reply.status();
    return entry_in(reply.value(), 0, key);
  }

  // The first key-value record at or after `from`; absent when there is none.
  Result<Entry> entry_in(const std::string& json, size_t from, const std::string& key) {
    Entry e;
    size_t kvs = json.find("\"kvs\":[", from);
    if (kvs == std::string::npos) return e;
    size_t end = json.find(']', kvs);
    std::string record = json.substr(kvs, end == std::string::npos ? std::string::npos : end - kvs);
    e.present = true;
    e.mod_revision = field(record, "mod_revision").value_or("");
    auto value = unbase64(field(record, "value").value_or(""));  // an empty value is left out
    if (!value) return Status(Code::Bootstrap, where() + ": a malformed value for '" + key + "'");
    e.value = std::move(*value);
    return e;
  }

  // One transaction: put `value` if `compare` holds, else read the key back.
  Result<std::pair<bool, Entry>> txn(const std::string& key, const std::string& compare,
                                     const std::string& value, int64_t timeout_ms, const std::string& what) {
    const std::string body = "{\"compare\":[{" + key_json(key) + "," + compare +
                             "}],\"success\":[{\"request_put\":{" + key_json(key) + ",\"value\":\"" +
                             base64(value) + "\"}}],\"failure\":[{\"request_range\":{" + key_json(key) + "}}]}";
    auto reply = post("/v3/kv/txn", body, timeout_ms, what);
    if (!reply.is_ok()) return reply.status();
    const bool swapped = reply.value().find("\"succeeded\":true") != std::string::npos;
    if (swapped) {
      Entry e;
      e.present = true;
      e.value = value;
      return std::make_pair(true, e);
    }
    auto now = entry_in(reply.value(), 0, key);
    if (!now.is_ok()) return now.status();
    return std::make_pair(false, now.value());
  }

  // The compare clause that holds while the key is as `e` says.
  static std::string unchanged(const Entry& e) {
    if (!e.present) return "\"target\":\"CREATE\",\"result\":\"EQUAL\",\"create_revision\":\"0\"";
    return "\"target\":\"MOD\",\"result\":\"EQUAL\",\"mod_revision\":\"" + e.mod_revision + "\"";
  }
};

EtcdStore::EtcdStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdStore::~EtcdStore() = default;

namespace {

struct EtcdAddress {
  std::string host_port;
  std::string prefix;
};

// Why `address` is not etcd://HOST:PORT[/PREFIX], or empty with its parts in `out`.
std::string parse_address(const std::string& address, EtcdAddress* out) {
  const std::string scheme = "etcd://";
  if (address.rfind(scheme, 0) != 0) return "not an etcd:// address";
  std::string rest = address.substr(scheme.size());
  const size_t slash = rest.find('/');
  out->host_port = rest.substr(0, slash);
  out->prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  while (!out->prefix.empty() && out->prefix.back() == '/') out->prefix.pop_back();
  const std::string& hp = out->host_port;
  const size_t colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size()) return "no host:port";
  const std::string port = hp.substr(colon + 1);
  if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::atoi(port.c_str()) < 1 || std::atoi(port.c_str()) > 65535) {
    return "bad port '" + port + "'";
  }
  if (std::any_of(hp.begin(), hp.end(), [](char c) { return c <= ' ' || c == '"' || c == '\\'; })) {
    return "bad host";
  }
  return {};
}

}  // namespace

std::string EtcdStore::check_address(const std::string& address) {
  EtcdAddress parts;
  std::string why = parse_address(address, &parts);
  return why.empty() ? why : why + " (expected etcd://HOST:PORT/PREFIX)";
}

Result<std::unique_ptr<EtcdStore>> EtcdStore::connect(const std::string& address, int64_t timeout_ms) {
  EtcdAddress parts;
  if (std::string why = parse_address(address, &parts); !why.empty()) {
    return Status(Code::InvalidArgument,
                  "etcd address '" + address + "': " + why + " (expected etcd://HOST:PORT/PREFIX)");
  }
  const std::string& host_port = parts.host_port;
  const std::string& prefix = parts.prefix;
  global_init();
  auto impl = std::make_unique<Impl>();
  impl->endpoint = "http://" + host_port;
  impl->prefix = prefix.empty() ? "" : prefix + "/";
  impl->address = address;
  impl->curl = curl_easy_init();
  if (impl->curl == nullptr) return Status(Code::NoMemory, "etcd: cannot create a curl handle");
  // etcd may start after the job's first peer: retry until it answers or time is up.
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
  Status last;
  do {
    auto reply = impl->post("/v3/maintenance/status", "{}", std::max<int64_t>(left_ms(deadline), 1),
                            "status");
    if (reply.is_ok()) return std::unique_ptr<EtcdStore>(new EtcdStore(std::move(impl)));
    last = reply.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(50, left_ms(deadline))));
  } while (left_ms(deadline) > 0);
  return Status(Code::Bootstrap, "cannot reach " + last.message() + " within " +
                                     std::to_string(timeout_ms) + " ms");
}

namespace {

Status invalid(const char* what, const std::string& key, const std::string& why) {
  return Status(Code::InvalidArgument, std::string("etcd: ") + what + " '" + key.substr(0, 64) + "': " + why);
}

}  // namespace

Status EtcdStore::set(const std::string& key, const std::string& value, int64_t timeout_ms) {
  if (std::string why = store_bounds_error(key, value.size()); !why.empty()) return invalid("set", key, why);
  auto reply = impl_->post("/v3/kv/put", "{" + impl_->key_json(key) + ",\"value\":\"" + base64(value) + "\"}",
                           timeout_ms, "set '" + key + "'");
  return reply.is_ok() ? Status() : reply.status();
}

Result<std::string> EtcdStore::get(const std::string& key, int64_t timeout_ms) {
  if (std::string why = store_bounds_error(key, 0); !why.empty()) return invalid("get", key, why);
  auto got = watch(key, std::nullopt, timeout_ms);
  if (!got.is_ok()) return got.status();
  if (!got.value()) return Status(Code::Bootstrap, impl_->where() + ": '" + key + "' vanished");
  return *got.value();
}

Result<int64_t> EtcdStore::add(const std::string& key, int64_t delta, int64_t timeout_ms) {
  if (std::string why = store_bounds_error(key, 0); !why.empty()) return invalid("add", key, why);
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
  auto seen = impl_->read(key, std::max<int64_t>(left_ms(deadline), 1));
  // Read, then write only if nobody wrote in between; a lost race reads again.
  for (;;) {
    if (!seen.is_ok()) return seen.status();
    const Entry& e = seen.value();
    int64_t now = 0;
    if (e.present) {
      char* end = nullptr;
      errno = 0;
      now = std::strtoll(e.value.c_str(), &end, 10);
      if (e.value.empty() || end != e.value.c_str() + e.value.size() || errno == ERANGE) {
        return invalid("add", key, "holds '" + e.value.substr(0, 32) + "', not a counter");
      }
    }
    int64_t sum = 0;
    if (__builtin_add_overflow(now, delta, &sum)) return invalid("add", key, "the sum overflows");
    auto done = impl_->txn(key, Impl::unchanged(e), std::to_string(sum), std::max<int64_t>(left_ms(deadline), 1),
                           "add '" + key + "'");
    if (!done.is_ok()) return done.status();
    if (done.value().first) return sum;
    if (left_ms(deadline) == 0) {
      return Status(Code::Timeout, impl_->where() + ": add '" + key + "' lost every race within " +
                                       std::to_string(timeout_ms) + " ms");
    }
    seen = impl_->read(key, std::max<int64_t>(left_ms(deadline), 1));
  }
}

Result<CasResult> EtcdStore::compare_and_set(const std::string& key, const std::optional<std::string>& expected,
                                             const std::string& value, int64_t timeout_ms) {
  const size_t longest = std::max(value.size(), expected ? expected->size() : 0);
  if (std::string why = store_bounds_error(key, longest); !why.empty()) {
    return invalid("compare-and-set", key, why);
  }
  const std::string compare =
      expected ? "\"target\":\"VALUE\",\"result\":\"EQUAL\",\"value\":\"" + base64(*expected) + "\""
               : "\"target\":\"CREATE\",\"result\":\"EQUAL\",\"create_revision\":\"0\"";
  auto done = impl_->txn(key, compare, value, timeout_ms, "compare-and-set '" + key + "'");
  if (!done.is_ok()) return done.status();
  CasResult r;
  r.swapped = done.value().first;
  if (done.value().second.present) r.current = done.value().second.value;
  return r;
}

Result<bool> EtcdStore::remove(const std::string& key, int64_t timeout_ms) {
  if (std::string why = store_bounds_error(key, 0); !why.empty()) return invalid("delete", key, why);
  auto reply = impl_->post("/v3/kv/deleterange", "{" + impl_->key_json(key) + "}", timeout_ms,
                           "delete '" + key + "'");
  if (!reply.is_ok()) return reply.status();
  auto deleted = field(reply.value(), "deleted");
  return deleted.has_value() && *deleted != "0";
}

Result<std::optional<std::string>> EtcdStore::watch(const std::string& key, const std::optional<std::string>& known,
                                                    int64_t timeout_ms) {
  if (std::string why = store_bounds_error(key, 0); !why.empty()) return invalid("watch", key, why);
  if (timeout_ms < 0) return invalid("watch", key, "negative timeout");
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    // A read near the deadline still gets time to be answered: the wait ends at most that
    // much late, rather than as an error of the transport.
    auto e = impl_->read(key, std::max<int64_t>(left_ms(deadline), kMinRequestMs));
    if (!e.is_ok()) return e.status();
    std::optional<std::string> now;
    if (e.value().present) now = e.value().value;
    if (now != known) return now;
    if (left_ms(deadline) == 0) {
      return Status(Code::Timeout, impl_->where() + ": '" + key + "' " +
                                       (known ? "did not change" : "was not set") + " within " +
                                       std::to_string(timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(kPollMs, left_ms(deadline))));
  }
}

}  // namespace taiji
