// The Store contract (bootstrap/store.h) on both backends, the embedded rendezvous server
// and etcd, with the same cases: what the runtime and the launcher rely on behaves the same
// whichever store a job runs on. Each backend's own edges are in test_store.cpp (the wire,
// the server's bounds) and test_store_etcd.cpp (addresses, prefixes, an absent etcd).
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../support/store_backends.h"

using namespace taiji;
using taiji_test::store_backend;
using Clock = std::chrono::steady_clock;

namespace {

int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

std::string backend_name() { return GENERATE(as<std::string>{}, "embedded", "etcd"); }

}  // namespace

TEST_CASE("store: set and get any bytes; get waits for a later set, or times out naming the key",
          "[store]") {
  const std::string name = backend_name();
  INFO(name);
  auto backend = store_backend(name);
  auto a = backend->client();
  auto b = backend->client();
  const std::string bytes("a\0b\n\"\\\xff", 8);
  REQUIRE(a->set("k", bytes, 2000).is_ok());
  CHECK(b->get("k", 2000).value() == bytes);
  REQUIRE(a->set("empty", "", 2000).is_ok());
  CHECK(b->get("empty", 2000).value() == "");
  auto later = std::async(std::launch::async, [&] { return b->get("late", 5000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(a->set("late", "v", 2000).is_ok());
  auto l = later.get();
  REQUIRE(l.is_ok());
  CHECK(l.value() == "v");
  const auto t0 = Clock::now();
  auto missing = b->get("never", 300);
  CHECK(missing.status().code() == Code::Timeout);
  CHECK_THAT(missing.status().message(), Catch::Contains("never"));
  CHECK(ms_since(t0) >= 290);
  CHECK(ms_since(t0) < 3000);
}

TEST_CASE("store: add counts from zero, atomically across clients; a non-counter and overflow are refused",
          "[store]") {
  const std::string name = backend_name();
  INFO(name);
  auto backend = store_backend(name);
  auto s = backend->client();
  CHECK(s->add("n", 5, 2000).value() == 5);
  CHECK(s->add("n", -7, 2000).value() == -2);
  CHECK(s->get("n", 1000).value() == "-2");  // decimal text, readable by get

  constexpr int kClients = 4, kAdds = 25;
  std::vector<std::unique_ptr<Store>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(backend->client());
  std::vector<std::future<bool>> workers;
  for (auto& c : clients) {
    workers.push_back(std::async(std::launch::async, [&c] {
      for (int k = 0; k < kAdds; ++k) {
        if (!c->add("shared", 1, 10000).is_ok()) return false;
      }
      return true;
    }));
  }
  for (auto& w : workers) {
    REQUIRE(w.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
    CHECK(w.get());
  }
  CHECK(s->add("shared", 0, 2000).value() == kClients * kAdds);

  REQUIRE(s->set("text", "abc", 2000).is_ok());
  auto r = s->add("text", 1, 2000);
  CHECK(r.status().code() == Code::InvalidArgument);
  CHECK(s->get("text", 1000).value() == "abc");
  REQUIRE(s->set("big", std::to_string(INT64_MAX), 2000).is_ok());
  CHECK(s->add("big", 1, 2000).status().code() == Code::InvalidArgument);
  CHECK(s->get("big", 1000).value() == std::to_string(INT64_MAX));
  // The client stays usable after a refusal.
  CHECK(s->add("fresh", 3, 2000).value() == 3);
}

TEST_CASE("store: compare-and-set swaps only from what it expects, absent included", "[store]") {
  const std::string name = backend_name();
  INFO(name);
  auto backend = store_backend(name);
  auto s = backend->client();
  auto created = s->compare_and_set("k", std::nullopt, "one", 2000);
  REQUIRE(created.is_ok());
  CHECK(created.value().swapped);
  CHECK(created.value().current == std::optional<std::string>("one"));
  auto exists = s->compare_and_set("k", std::nullopt, "other", 2000);
  REQUIRE(exists.is_ok());
  CHECK_FALSE(exists.value().swapped);
  CHECK(exists.value().current == std::optional<std::string>("one"));
  auto wrong = s->compare_and_set("k", std::string("two"), "three", 2000);
  REQUIRE(wrong.is_ok());
  CHECK_FALSE(wrong.value().swapped);
  CHECK(wrong.value().current == std::optional<std::string>("one"));
  auto swapped = s->compare_and_set("k", std::string("one"), "", 2000);
  REQUIRE(swapped.is_ok());
  CHECK(swapped.value().swapped);
  CHECK(swapped.value().current == std::optional<std::string>(""));
  CHECK(s->get("k", 1000).value() == "");
  auto missing = s->compare_and_set("nope", std::string(""), "x", 2000);
  REQUIRE(missing.is_ok());
  CHECK_FALSE(missing.value().swapped);
  CHECK_FALSE(missing.value().current.has_value());
  CHECK(s->get("nope", 0).status().code() == Code::Timeout);
}

TEST_CASE("store: delete says whether the key was there; a deleted counter starts again", "[store]") {
  const std::string name = backend_name();
  INFO(name);
  auto backend = store_backend(name);
  auto s = backend->client();
  REQUIRE(s->set("k", "v", 2000).is_ok());
  CHECK(s->remove("k", 2000).value() == true);
  CHECK(s->get("k", 0).status().code() == Code::Timeout);
  CHECK(s->remove("k", 2000).value() == false);
  CHECK(s->add("k", 2, 2000).value() == 2);
}

TEST_CASE("store: watch sees a change, a delete, an add and a compare-and-set; the same value is no change",
          "[store]") {
  const std::string name = backend_name();
  INFO(name);
  auto backend = store_backend(name);
  auto watcher = backend->client();
  auto writer = backend->client();
  REQUIRE(writer->set("k", "v1", 2000).is_ok());

  auto t0 = Clock::now();
  auto changed = std::async(std::launch::async, [&] { return watcher->watch("k", std::string("v1"), 10000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE(writer->set("k", "v1", 2000).is_ok());
  CHECK(changed.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
  REQUIRE(writer->set("k", "v2", 2000).is_ok());
  REQUIRE(changed.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  auto seen = changed.get();
  INFO(seen.status().message());
  REQUIRE(seen.is_ok());
  CHECK(seen.value() == std::optional<std::string>("v2"));
  CHECK(ms_since(t0) >= 350);

  auto deleted = std::async(std::launch::async, [&] { return watcher->watch("k", std::string("v2"), 10000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(writer->remove("k", 2000).value());
  REQUIRE(deleted.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  auto gone = deleted.get();
  REQUIRE(gone.is_ok());
  CHECK_FALSE(gone.value().has_value());

  auto appears = std::async(std::launch::async, [&] { return watcher->watch("k", std::nullopt, 10000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(writer->add("k", 7, 2000).is_ok());
  REQUIRE(appears.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(appears.get().value() == std::optional<std::string>("7"));
  auto cas = std::async(std::launch::async, [&] { return watcher->watch("k", std::string("7"), 10000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(writer->compare_and_set("k", std::string("7"), "8", 2000).value().swapped);
  REQUIRE(cas.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(cas.get().value() == std::optional<std::string>("8"));
}

TEST_CASE("store: watch answers at once when the key already differs from what is known", "[store]") {
  const std::string name = backend_name();
  INFO(name);
  auto backend = store_backend(name);
  auto s = backend->client();
  REQUIRE(s->set("k", "new", 2000).is_ok());
  auto t0 = Clock::now();
  CHECK(s->watch("k", std::string("old"), 10000).value() == std::optional<std::string>("new"));
  CHECK(s->watch("k", std::nullopt, 10000).value() == std::optional<std::string>("new"));
  CHECK_FALSE(s->watch("absent", std::string("old"), 10000).value().has_value());
  CHECK(ms_since(t0) < 5000);
}

TEST_CASE("store: watch ends at its deadline, naming the key, and the client stays usable", "[store]") {
  const std::string name = backend_name();
  INFO(name);
  auto backend = store_backend(name);
  auto s = backend->client();
  REQUIRE(s->set("k", "v", 2000).is_ok());
  auto t0 = Clock::now();
  auto r = s->watch("k", std::string("v"), 300);
  const int64_t elapsed = ms_since(t0);
  CHECK(r.status().code() == Code::Timeout);
  CHECK_THAT(r.status().message(), Catch::Contains("'k'"));
  CHECK(elapsed >= 250);
  CHECK(elapsed < 5000);
  CHECK(s->watch("k", std::string("v"), 0).status().code() == Code::Timeout);
  CHECK(s->get("k", 1000).value() == "v");
}
