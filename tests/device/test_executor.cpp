// The device executor over the fake device runtime: N executors, each with its own thread,
// are the ranks of one communicator. Callbacks run on executor threads, so they only record;
// every assertion is made here, after a bounded wait.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "../support/fake_device.h"
#include "device/device_executor.h"
#include "monitor/metrics.h"

using namespace taiji;
using taiji_test::FakeDeviceRuntime;

namespace {

constexpr uint64_t kMs = 1'000'000;

// What one executor's callbacks reported.
class Outcomes {
 public:
  struct Done {
    Status status;
    uint64_t at_ns = 0;
    std::thread::id thread;
  };

  void on_done(uint64_t tag, const Status& st) {
    std::lock_guard lk(mu_);
    done_[tag] = {st, monotonic_ns(), std::this_thread::get_id()};
    cv_.notify_all();
  }
  void on_failed(const Status& why) {
    std::lock_guard lk(mu_);
    failed_.push_back(why);
    done_before_failed_ = done_.size();
    cv_.notify_all();
  }
  // Whether `n` ops have their outcome within `ms`.
  bool wait(size_t n, int ms) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, std::chrono::milliseconds(ms), [&] { return done_.size() >= n; });
  }
  Done get(uint64_t tag) {
    std::lock_guard lk(mu_);
    auto it = done_.find(tag);
    return it == done_.end() ? Done{Status(Code::NotFound, "no outcome"), 0, {}} : it->second;
  }
  std::vector<Status> failed() {
    std::lock_guard lk(mu_);
    return failed_;
  }
  size_t done_before_failed() {
    std::lock_guard lk(mu_);
    return done_before_failed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Done> done_;
  std::vector<Status> failed_;
  size_t done_before_failed_ = 0;
};

struct Peer {
  Outcomes out;  // outlives the executor, whose destructor still reports
  std::unique_ptr<DeviceExecutor> ex;
};

DeviceExecutorOptions options(int64_t init_timeout_ms = 10000) {
  DeviceExecutorOptions o;
  o.init_timeout_ms = init_timeout_ms;
  o.poll_us = 50;
  return o;
}

// `n` executors over one fake; inject into `fake` before init().
struct Group {
  explicit Group(int n, DeviceExecutorOptions opt = options()) : size(n) {
    id = fake->make_id().value();
    for (int r = 0; r < n; ++r) {
      auto p = std::make_unique<Peer>();
      Outcomes* o = &p->out;
      p->ex = std::make_unique<DeviceExecutor>(
          fake, opt, [o](uint64_t tag, const Status& st) { o->on_done(tag, st); },
          [o](const Status& why) { o->on_failed(why); });
      peers.push_back(std::move(p));
    }
  }
  void init() {
    for (int r = 0; r < size; ++r) peers[r]->ex->init(id, r, size, 0);
  }
  DeviceExecutor& ex(int r) { return *peers[r]->ex; }
  Outcomes& out(int r) { return peers[r]->out; }
  template <typename T>
  T* alloc(size_t n) {
    return static_cast<T*>(fake->alloc(n * sizeof(T)));
  }

  std::shared_ptr<FakeDeviceRuntime> fake = std::make_shared<FakeDeviceRuntime>();
  int size;
  std::string id;
  std::vector<std::unique_ptr<Peer>> peers;
};

DeviceWork work(uint64_t tag, DeviceOp op, int64_t deadline_ms = 0) {
  DeviceWork w;
  w.tag = tag;
  w.op = op;
  w.deadline_ns = deadline_ms > 0 ? monotonic_ns() + deadline_ms * kMs : 0;
  w.label = std::string(op_kind_name(op.kind)) + " 'op." + std::to_string(tag) + "' version 1";
  return w;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// One float allreduce of `count` on rank `r`'s own buffer, in place.
DeviceOp allreduce(float* buf, uint64_t count) {
  return {OpKind::Allreduce, DType::F32, RedOp::Sum, count, 0, buf, buf, nullptr};
}

}  // namespace

TEST_CASE("device executor: batches in the same order complete with NCCL's results",
          "[device_executor]") {
  for (int n : {2, 4}) {
    INFO(n << " ranks");
    Group g(n);
    g.init();
    const uint64_t c = 6;
    std::vector<float*> sum(n);
    std::vector<int64_t*> bcast(n);
    std::vector<int32_t*> gather_in(n), gather_out(n);
    std::vector<double*> rs_in(n), rs_out(n);
    for (int r = 0; r < n; ++r) {
      sum[r] = g.alloc<float>(c);
      bcast[r] = g.alloc<int64_t>(c);
      gather_in[r] = g.alloc<int32_t>(c);
      gather_out[r] = g.alloc<int32_t>(c * n);
      rs_in[r] = g.alloc<double>(c * n);
      rs_out[r] = g.alloc<double>(c);
      for (uint64_t i = 0; i < c; ++i) {
        sum[r][i] = static_cast<float>(r + 1) + static_cast<float>(i);
        bcast[r][i] = r == 1 ? 1000 + static_cast<int64_t>(i) : -1;
        gather_in[r][i] = 10 * r + static_cast<int32_t>(i);
      }
      for (uint64_t i = 0; i < c * n; ++i) rs_in[r][i] = static_cast<double>((r * 7 + i) % 11);
      g.ex(r).submit({work(1, allreduce(sum[r], c))});
      g.ex(r).submit(
          {work(2, {OpKind::Broadcast, DType::I64, RedOp::Sum, c, 1, bcast[r], bcast[r], nullptr}),
           work(3, {OpKind::Allgather, DType::I32, RedOp::Sum, c, 0, gather_in[r], gather_out[r],
                    nullptr})});
      g.ex(r).submit({work(
          4, {OpKind::ReduceScatter, DType::F64, RedOp::Max, c, 0, rs_in[r], rs_out[r], nullptr})});
    }
    for (int r = 0; r < n; ++r) REQUIRE(g.out(r).wait(4, 5000));
    for (int r = 0; r < n; ++r) {
      for (uint64_t tag = 1; tag <= 4; ++tag) {
        CHECK(g.out(r).get(tag).status.is_ok());
        CHECK(g.out(r).get(tag).thread != std::this_thread::get_id());
      }
      CHECK(g.out(r).failed().empty());
      CHECK(g.ex(r).ready());
      CHECK(g.fake->launched(r) == g.fake->launched(0));
      for (uint64_t i = 0; i < c; ++i) {
        CHECK(sum[r][i] == static_cast<float>(n * (n + 1) / 2 + n * i));
        CHECK(bcast[r][i] == 1000 + static_cast<int64_t>(i));
        double max = 0;
        for (int q = 0; q < n; ++q)
          max = std::max(max, static_cast<double>((q * 7 + r * c + i) % 11));
        CHECK(rs_out[r][i] == max);
      }
      for (uint64_t i = 0; i < c * n; ++i)
        CHECK(gather_out[r][i] == static_cast<int32_t>(10 * (i / c) + i % c));
    }
    CHECK(g.fake->launched(0).size() == 4);
    CHECK(g.fake->violations() == 0);
  }
}

TEST_CASE("device executor: ranks whose batches differ are caught by the fake",
          "[device_executor]") {
  // The executor launches what it is given; agreeing on specs is the sequencer's job. This
  // proves the fake would catch a sequencer that let a disagreement through.
  Group g(2);
  g.init();
  float* a = g.alloc<float>(8);
  float* b = g.alloc<float>(8);
  g.ex(0).submit({work(1, allreduce(a, 4), 300)});
  g.ex(1).submit({work(1, allreduce(b, 8), 300)});
  for (int r = 0; r < 2; ++r) {
    REQUIRE(g.out(r).wait(1, 3000));
    CHECK(g.out(r).get(1).status.code() == Code::Timeout);
  }
  CHECK(g.fake->violations() == 1);
  CHECK(contains(g.fake->violation_text(), "count 8"));
}

TEST_CASE("device executor: a slow init under its timeout completes", "[device_executor]") {
  Group g(2, options(5000));
  g.fake->init_delay_ms(1, 300);
  g.init();
  std::vector<float*> buf = {g.alloc<float>(3), g.alloc<float>(3)};
  for (int r = 0; r < 2; ++r) {
    std::fill(buf[r], buf[r] + 3, 1.5f);
    g.ex(r).submit({work(7, allreduce(buf[r], 3), 5000)});
  }
  CHECK_FALSE(g.ex(0).ready());
  for (int r = 0; r < 2; ++r) {
    REQUIRE(g.out(r).wait(1, 5000));
    CHECK(g.out(r).get(7).status.is_ok());
    CHECK(buf[r][2] == 3.0f);
    CHECK(g.ex(r).ready());
  }
}

TEST_CASE("device executor: an init past its timeout fails everything, sticky",
          "[device_executor]") {
  Group g(2, options(300));
  g.fake->init_delay_ms(1, 60000);
  uint64_t start = monotonic_ns();
  g.init();
  std::vector<float*> buf = {g.alloc<float>(2), g.alloc<float>(2)};
  for (int r = 0; r < 2; ++r) {
    g.ex(r).submit({work(1, allreduce(buf[r], 2))});
    g.ex(r).submit({work(2, allreduce(buf[r], 1)), work(3, allreduce(buf[r], 2))});
  }
  for (int r = 0; r < 2; ++r) {
    REQUIRE(g.out(r).wait(3, 3000));
    for (uint64_t tag = 1; tag <= 3; ++tag) {
      auto d = g.out(r).get(tag);
      CHECK(d.status.code() == Code::Timeout);
      CHECK(d.status.message() == "device communicator init did not finish within 300 ms");
      CHECK(d.at_ns - start >= 300 * kMs);
      CHECK(d.at_ns - start < 1300 * kMs);
    }
    CHECK(g.out(r).failed().size() == 1);
    CHECK(g.ex(r).error().code() == Code::Timeout);
    CHECK_FALSE(g.ex(r).ready());
    g.ex(r).submit({work(4, allreduce(buf[r], 2))});
    REQUIRE(g.out(r).wait(4, 1000));
    CHECK(g.out(r).get(4).status.message() == g.ex(r).error().message());
  }
  CHECK(g.fake->aborts() == 2);
}

TEST_CASE("device executor: a hang on one rank times every rank's op out at its deadline",
          "[device_executor]") {
  for (int n : {2, 4}) {
    INFO(n << " ranks");
    Group g(n);
    g.fake->hang_batch(1, 1);
    g.init();
    std::vector<float*> buf(n);
    // Each op's deadline lies between these two.
    std::vector<uint64_t> earliest(n), latest(n);
    for (int r = 0; r < n; ++r) {
      buf[r] = g.alloc<float>(4);
      g.ex(r).submit({work(1, allreduce(buf[r], 4), 5000)});
      earliest[r] = monotonic_ns() + 400 * kMs;
      g.ex(r).submit({work(2, allreduce(buf[r], 4), 400)});
      latest[r] = monotonic_ns() + 400 * kMs;
    }
    for (int r = 0; r < n; ++r) {
      REQUIRE(g.out(r).wait(2, 3000));
      CHECK(g.out(r).get(1).status.is_ok());
      auto d = g.out(r).get(2);
      CHECK(d.status.code() == Code::Timeout);
      CHECK(contains(d.status.message(), "allreduce 'op.2' version 1"));
      CHECK(contains(d.status.message(), "the device communicator was aborted"));
      CHECK(d.at_ns >= earliest[r]);
      CHECK(d.at_ns < latest[r] + 1000 * kMs);
      REQUIRE(g.out(r).failed().size() == 1);
      CHECK(g.out(r).failed()[0].message() == d.status.message());
      CHECK(g.out(r).done_before_failed() == 1);
    }
    CHECK(g.fake->aborts() == static_cast<uint64_t>(n));
    // Later submits fail at once with the sticky error.
    for (int r = 0; r < n; ++r) {
      uint64_t at = monotonic_ns();
      g.ex(r).submit({work(3, allreduce(buf[r], 4), 5000)});
      REQUIRE(g.out(r).wait(3, 1000));
      auto d = g.out(r).get(3);
      CHECK(d.status.message() == g.ex(r).error().message());
      CHECK(d.at_ns - at < 200 * kMs);
      CHECK(d.thread != std::this_thread::get_id());
      CHECK(g.out(r).failed().size() == 1);
    }
  }
}

TEST_CASE("device executor: an asynchronous error fails what is in flight with it",
          "[device_executor]") {
  Group g(2);
  // 200 ms of device time per batch: batches 1 and 2 are still in flight when batch 0 ends.
  g.fake->device_time_us(200000);
  g.fake->async_error_after(0, 0, Status(Code::Io, "injected NCCL error"));
  g.init();
  std::vector<float*> buf = {g.alloc<float>(2), g.alloc<float>(2)};
  for (int r = 0; r < 2; ++r)
    for (uint64_t tag = 0; tag < 3; ++tag) g.ex(r).submit({work(tag, allreduce(buf[r], 2), 10000)});
  REQUIRE(g.out(0).wait(3, 5000));
  CHECK(g.out(0).get(0).status.is_ok());
  for (uint64_t tag : {1, 2}) {
    CHECK(g.out(0).get(tag).status.code() == Code::Io);
    CHECK(g.out(0).get(tag).status.message() == "injected NCCL error");
  }
  REQUIRE(g.out(0).failed().size() == 1);
  CHECK(g.out(0).failed()[0].message() == "injected NCCL error");
  CHECK(g.out(0).done_before_failed() == 1);
  CHECK(g.ex(0).error().code() == Code::Io);
  // Rank 1 had launched every batch before rank 0 aborted, so they were matched and run.
  REQUIRE(g.out(1).wait(3, 5000));
  for (uint64_t tag = 0; tag < 3; ++tag) CHECK(g.out(1).get(tag).status.is_ok());
}

TEST_CASE("device executor: abort from another thread fails hanging ops at once",
          "[device_executor]") {
  Group g(2);
  g.fake->hang_batch(0, 0);
  g.init();
  std::vector<float*> buf = {g.alloc<float>(2), g.alloc<float>(2)};
  for (int r = 0; r < 2; ++r) {
    g.ex(r).submit({work(1, allreduce(buf[r], 2))});
    g.ex(r).submit({work(2, allreduce(buf[r], 2))});
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(g.out(0).wait(1, 0));
  const Status why(Code::PeerLost, "rank 1 went away");
  uint64_t at = 0;
  std::thread t([&] {
    at = monotonic_ns();
    g.ex(0).abort(why);
    g.ex(0).abort(Status(Code::Internal, "a second abort"));
  });
  t.join();
  REQUIRE(g.out(0).wait(2, 1000));
  for (uint64_t tag : {1, 2}) {
    auto d = g.out(0).get(tag);
    CHECK(d.status.code() == Code::PeerLost);
    CHECK(d.status.message() == "rank 1 went away");
    CHECK(d.at_ns - at < 100 * kMs);
  }
  REQUIRE(g.out(0).failed().size() == 1);
  CHECK(g.out(0).failed()[0].message() == "rank 1 went away");
  CHECK(g.ex(0).error().message() == "rank 1 went away");
  // The other rank's ops stay in flight until its executor closes.
  CHECK_FALSE(g.out(1).wait(1, 50));
  g.peers[1]->ex.reset();
  CHECK(g.out(1).get(1).status.message() == "peer closed");
  CHECK(g.out(1).get(2).status.code() == Code::Aborted);
  CHECK(g.out(1).failed().size() == 1);
  CHECK(g.fake->aborts() == 2);
}

TEST_CASE("device executor: a clean finalize on every rank", "[device_executor]") {
  for (int n : {2, 4}) {
    INFO(n << " ranks");
    Group g(n);
    g.fake->device_time_us(100000);  // the op is still in flight when finalize starts
    g.init();
    std::vector<float*> buf(n);
    for (int r = 0; r < n; ++r) {
      buf[r] = g.alloc<float>(1);
      buf[r][0] = 2.0f;
      g.ex(r).submit({work(1, allreduce(buf[r], 1), 10000)});
    }
    std::vector<Status> st(n, Status(Code::Internal, "not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { st[r] = g.ex(r).finalize(5000); });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      CHECK(st[r].is_ok());
      // finalize returned after the op's outcome.
      CHECK(g.out(r).get(1).status.is_ok());
      CHECK(buf[r][0] == 2.0f * n);
      CHECK(g.out(r).failed().empty());
      CHECK(g.ex(r).error().is_ok());
      CHECK_FALSE(g.ex(r).ready());
      g.ex(r).submit({work(2, allreduce(buf[r], 1))});
      REQUIRE(g.out(r).wait(2, 1000));
      CHECK(g.out(r).get(2).status.code() == Code::Finalized);
      CHECK(g.ex(r).finalize(10).is_ok());  // answered again, not redone
    }
    CHECK(g.fake->aborts() == 0);
  }
}

TEST_CASE("device executor: finalize with a rank that never finalizes times out",
          "[device_executor]") {
  Group g(3);
  g.init();
  std::vector<float*> buf = {g.alloc<float>(1), g.alloc<float>(1), g.alloc<float>(1)};
  for (int r = 0; r < 3; ++r) g.ex(r).submit({work(1, allreduce(buf[r], 1), 5000)});
  for (int r = 0; r < 3; ++r) REQUIRE(g.out(r).wait(1, 5000));
  Status st[2];
  uint64_t start = monotonic_ns();
  std::thread t([&] { st[1] = g.ex(1).finalize(300); });
  st[0] = g.ex(0).finalize(300);
  t.join();
  uint64_t took = monotonic_ns() - start;
  for (const Status& s : st) CHECK(s.code() == Code::Timeout);
  CHECK(took >= 300 * kMs);
  CHECK(took < 1300 * kMs);
  CHECK(g.fake->aborts() == 2);
  CHECK(g.ex(0).error().code() == Code::Timeout);
  CHECK(g.out(0).failed().empty());
}

TEST_CASE("device executor: finalize with an op hanging past its timeout aborts",
          "[device_executor]") {
  Group g(2);
  g.fake->hang_batch(0, 0);
  g.init();
  std::vector<float*> buf = {g.alloc<float>(1), g.alloc<float>(1)};
  for (int r = 0; r < 2; ++r) g.ex(r).submit({work(1, allreduce(buf[r], 1))});
  uint64_t start = monotonic_ns();
  Status st = g.ex(0).finalize(300);
  uint64_t took = monotonic_ns() - start;
  CHECK(st.code() == Code::Timeout);
  CHECK(contains(st.message(), "still pending"));
  CHECK(took >= 300 * kMs);
  CHECK(took < 1300 * kMs);
  CHECK(g.out(0).get(1).status.message() == st.message());
  CHECK(g.out(0).failed().size() == 1);
}

TEST_CASE("device executor: init and device failures", "[device_executor]") {
  SECTION("an init that fails") {
    Group g(2);
    g.fake->fail_init(1, Status(Code::Internal, "injected init failure"));
    g.init();
    float* buf = g.alloc<float>(1);
    g.ex(1).submit({work(1, allreduce(buf, 1))});
    REQUIRE(g.out(1).wait(1, 3000));
    CHECK(g.out(1).get(1).status.message() == "injected init failure");
    CHECK(g.out(1).failed().size() == 1);
  }
  SECTION("no device") {
    Group g(1);
    g.fake->make_unusable("no GPU visible");
    g.init();
    float host[1] = {0};
    g.ex(0).submit({work(1, allreduce(host, 1))});
    REQUIRE(g.out(0).wait(1, 3000));
    CHECK(g.out(0).get(1).status.code() == Code::NoDevice);
    CHECK(g.ex(0).error().message() == "no GPU visible");
  }
  SECTION("a launch the runtime refuses") {
    Group g(1);
    g.init();
    float host[1] = {0};
    g.ex(0).submit({work(1, allreduce(host, 1))});
    REQUIRE(g.out(0).wait(1, 3000));
    CHECK(g.out(0).get(1).status.code() == Code::InvalidArgument);
    CHECK(contains(g.out(0).get(1).status.message(), "launching allreduce 'op.1' version 1"));
  }
  SECTION("an op queued before init() past its deadline") {
    Group g(1);
    float* buf = g.alloc<float>(1);
    g.ex(0).submit({work(1, allreduce(buf, 1), 100)});
    REQUIRE(g.out(0).wait(1, 2000));
    CHECK(g.out(0).get(1).status.code() == Code::Timeout);
  }
}
