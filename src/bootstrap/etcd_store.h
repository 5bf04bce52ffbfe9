// The Store interface over etcd v3 (Debian's etcd-server 3.4 and later), through its JSON
// gateway, for jobs that outgrow the store one launcher embeds. Address form:
// "etcd://HOST:PORT/PREFIX"; every key lives under PREFIX/ (none without PREFIX), so that
// jobs sharing one etcd do not meet. Keys and values travel base64-encoded in the JSON, so
// any bytes are fine.
//
// Calls block as the Store interface says; blocking get and watch poll the key (every
// kPollMs), which keeps every wait bounded by its timeout without a streaming watch. Not
// thread-safe: one call at a time, as RendezvousClient.
#pragma once

#include <memory>
#include <string>

#include "bootstrap/store.h"

namespace taiji {

class EtcdStore final : public Store {
 public:
  static constexpr int kPollMs = 10;

  // Parses the address and checks that etcd answers within timeout_ms (Code::Bootstrap
  // naming the address otherwise); a malformed address is Code::InvalidArgument.
  static Result<std::unique_ptr<EtcdStore>> connect(const std::string& address, int64_t timeout_ms);
  // Empty when `address` is a well-formed etcd address, else why not.
  static std::string check_address(const std::string& address);
  static bool is_etcd_address(const std::string& address) { return address.rfind("etcd://", 0) == 0; }
  ~EtcdStore() override;

  Status set(const std::string& key, const std::string& value, int64_t timeout_ms) override;
  Result<std::string> get(const std::string& key, int64_t timeout_ms) override;
  Result<int64_t> add(const std::string& key, int64_t delta, int64_t timeout_ms) override;
  Result<CasResult> compare_and_set(const std::string& key,
                                    const std::optional<std::string>& expected,
                                    const std::string& value, int64_t timeout_ms) override;
  Result<bool> remove(const std::string& key, int64_t timeout_ms) override;
  Result<std::optional<std::string>> watch(const std::string& key,
                                           const std::optional<std::string>& known,
                                           int64_t timeout_ms) override;

  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  struct Impl;

 private:
  explicit EtcdStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace taiji
