// Version bookkeeping per op name: automatic versions, duplicates, stale versions, and a
// post that failed before its op was handed over.
#include <catch2/catch.hpp>

#include "runtime/name_table.h"

using taiji::Code;
using taiji::NameTable;

TEST_CASE("name table: automatic versions count the calls of a name", "[names]") {
  NameTable t;
  CHECK(t.reserve("a", 0).value() == 1);
  CHECK(t.reserve("a", 0).value() == 2);
  CHECK(t.reserve("b", 0).value() == 1);
  CHECK(t.reserve("a", 0).value() == 3);
}

TEST_CASE("name table: a version in flight is a duplicate, one at or below an ended one is stale",
          "[names]") {
  NameTable t;
  REQUIRE(t.reserve("a", 5).value() == 5);
  CHECK(t.reserve("a", 5).status().code() == Code::Duplicate);
  t.release("a", 5);
  CHECK(t.reserve("a", 5).status().code() == Code::StaleVersion);
  CHECK(t.reserve("a", 3).status().code() == Code::StaleVersion);
  CHECK(t.is_past("a", 4));
  CHECK(t.reserve("a", 0).value() == 6);
}

TEST_CASE("name table: an unreserved version is given again, and the count stays with the other peers'",
          "[names]") {
  NameTable t;
  REQUIRE(t.reserve("a", 0).value() == 1);
  REQUIRE(t.reserve("a", 0).value() == 2);
  t.unreserve("a", 2);
  CHECK_FALSE(t.posted("a", 2));
  CHECK(t.reserve("a", 0).value() == 2);
  // An explicit version far ahead, unreserved: automatic versions go on from the rest.
  REQUIRE(t.reserve("a", 10).value() == 10);
  t.unreserve("a", 10);
  CHECK(t.reserve("a", 0).value() == 3);
  // Below a version still in flight or ended, nothing moves back.
  t.release("a", 3);
  REQUIRE(t.reserve("a", 0).value() == 4);
  t.unreserve("a", 4);
  CHECK(t.reserve("a", 0).value() == 4);
  REQUIRE(t.reserve("a", 7).value() == 7);
  t.unreserve("a", 4);
  CHECK(t.reserve("a", 0).value() == 8);
}
