#include <catch2/catch.hpp>

#include <string>
#include <thread>
#include <vector>

#include "adapt/model_store.h"

using namespace taiji;

namespace {

std::vector<uint8_t> bytes_of(uint8_t value, size_t n) { return std::vector<uint8_t>(n, value); }

uint64_t save(ModelStore& s, const std::string& name, const std::vector<uint8_t>& b, uint64_t version = 0) {
  auto r = s.save(name, b.data(), b.size(), version);
  REQUIRE(r.is_ok());
  return r.value();
}

}  // namespace

TEST_CASE("versions count up from 1 per name and the latest is found", "[modelstore]") {
  ModelStore s(3, 1 << 20);
  REQUIRE(save(s, "w", bytes_of(1, 8)) == 1);
  REQUIRE(save(s, "w", bytes_of(2, 8)) == 2);
  REQUIRE(save(s, "other", bytes_of(9, 4)) == 1);
  auto latest = s.find("w", 0);
  REQUIRE(latest.is_ok());
  REQUIRE(latest.value().version == 2);
  REQUIRE(*latest.value().bytes == bytes_of(2, 8));
  auto first = s.find("w", 1);
  REQUIRE(first.is_ok());
  REQUIRE(*first.value().bytes == bytes_of(1, 8));
  REQUIRE(s.bytes_held() == 20);
}

TEST_CASE("an explicit version must be above the latest kept", "[modelstore]") {
  ModelStore s(3, 1 << 20);
  REQUIRE(save(s, "w", bytes_of(1, 4), 10) == 10);
  auto same = s.save("w", bytes_of(2, 4).data(), 4, 10);
  REQUIRE(same.status().code() == Code::StaleVersion);
  REQUIRE(same.status().message() == "model 'w': version 10 is not above the latest kept, 10");
  REQUIRE(s.save("w", bytes_of(2, 4).data(), 4, 3).status().code() == Code::StaleVersion);
  REQUIRE(save(s, "w", bytes_of(3, 4)) == 11);
  REQUIRE(save(s, "w", bytes_of(4, 4), 20) == 20);
}

TEST_CASE("the oldest version is evicted past K and is then not found", "[modelstore]") {
  ModelStore s(2, 1 << 20);
  save(s, "w", bytes_of(1, 16));
  auto held = s.find("w", 1);  // a reply still sending version 1
  REQUIRE(held.is_ok());
  save(s, "w", bytes_of(2, 16));
  save(s, "w", bytes_of(3, 16));
  auto gone = s.find("w", 1);
  REQUIRE(gone.status().code() == Code::NotFound);
  REQUIRE(gone.status().message() == "model 'w' has no version 1 (kept: 2, 3)");
  REQUIRE(s.find("w", 2).is_ok());
  REQUIRE(s.bytes_held() == 32);
  // The evicted blob stays valid for whoever still holds it.
  REQUIRE(*held.value().bytes == bytes_of(1, 16));
  REQUIRE(s.find("nothing", 0).status().code() == Code::NotFound);
  REQUIRE(s.find("nothing", 0).status().message() == "no model 'nothing' was saved");
}

TEST_CASE("a save past the byte bound fails and keeps everything", "[modelstore]") {
  ModelStore s(3, 100);
  save(s, "a", bytes_of(1, 40));
  save(s, "b", bytes_of(2, 40));
  auto over = s.save("c", bytes_of(3, 30).data(), 30, 0);
  REQUIRE(over.status().code() == Code::NoMemory);
  REQUIRE(over.status().message() ==
          "model 'c': saving 30 bytes would pass the store's bound (TAIJI_MODEL_STORE_BYTES) of 100 "
          "bytes; it holds 80 bytes");
  REQUIRE(s.bytes_held() == 80);
  REQUIRE(*s.find("a", 1).value().bytes == bytes_of(1, 40));
  REQUIRE(*s.find("b", 1).value().bytes == bytes_of(2, 40));
  REQUIRE(s.find("c", 0).status().code() == Code::NotFound);
  // The version a save evicts makes room for it.
  ModelStore one(1, 50);
  save(one, "w", bytes_of(1, 40));
  REQUIRE(save(one, "w", bytes_of(2, 40)) == 2);
  REQUIRE(one.bytes_held() == 40);
}

TEST_CASE("saves and lookups from several threads agree", "[modelstore]") {
  ModelStore s(3, 1 << 24);
  std::thread saver([&] {
    for (uint8_t v = 1; v <= 200; ++v) save(s, "w", bytes_of(v, 1024));
  });
  uint64_t last = 0;
  for (int i = 0; i < 2000; ++i) {
    auto r = s.find("w", 0);
    if (!r.is_ok()) continue;
    REQUIRE(r.value().version >= last);  // the latest never goes back
    last = r.value().version;
    REQUIRE(*r.value().bytes == bytes_of(static_cast<uint8_t>(last), 1024));
  }
  saver.join();
  REQUIRE(s.find("w", 0).value().version == 200);
  REQUIRE(s.bytes_held() == 3 * 1024);
}
