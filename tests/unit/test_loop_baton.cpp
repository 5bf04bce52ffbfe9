// The loop baton: a waiter runs the lent loop on its own thread, the I/O thread takes it
// back (at once when work is left, else after its park), a closed baton is never taken,
// and no completion is missed whoever runs the loop. The "loop" here is a fake whose
// drive() completes requests, so each property is checked without sockets.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/loop_baton.h"
#include "runtime/progress.h"
#include "runtime/request.h"
#include "waiter_race.h"

using namespace taiji;
using taiji_test::race_waiters;

namespace {

constexpr uint64_t kMs = 1000000;

// A loop whose only work is to complete `target` when driven (if set), on the driving
// thread; it reports whether it leaves work behind.
class FakeLoop : public LoopBaton::Driver {
 public:
  bool drive(const std::atomic<bool>& done, uint64_t window_ns, uint64_t hard_ns) override {
    ++drives;
    driver_thread = std::this_thread::get_id();
    if (target != nullptr) target->complete({Code::Mismatch, "driven"});
    const uint64_t until = std::min(progress_now_ns() + window_ns, hard_ns);
    while (!done.load() && progress_now_ns() < until) progress_pause();
    return leave_work;
  }
  bool owes_io_thread() const override { return owe_io; }
  std::shared_ptr<RequestState> target;  // set while no waiter runs
  std::atomic<bool> leave_work{false};
  std::atomic<bool> owe_io{false};       // every drive leaves work only the I/O thread may do
  std::atomic<int> drives{0};
  std::atomic<std::thread::id> driver_thread;
};

// The I/O thread's side: owns the loop, lends it whenever a waiter asks, counts how often
// it got it back.
class FakeIoThread {
 public:
  FakeIoThread(std::shared_ptr<LoopBaton> baton, FakeLoop* loop)
      : baton_(std::move(baton)), loop_(loop), thread_([this] { run(); }) {}
  ~FakeIoThread() {
    stop_ = true;
    // A parked thread wakes only for a waiter that leaves work: be one.
    loop_->target = nullptr;
    loop_->leave_work = true;
    RequestState kick(0, nullptr);
    kick.set_spin(kMs, baton_);
    kick.wait_for(10, nullptr);
    thread_.join();
  }
  int reclaims() const { return reclaims_.load(); }

 private:
  void run() {
    while (!stop_.load()) {
      if (baton_->wanted()) {
        baton_->lend_and_park();
        ++reclaims_;
      }
      progress_pause();
    }
    baton_->close();
  }
  std::shared_ptr<LoopBaton> baton_;
  FakeLoop* loop_;
  std::atomic<bool> stop_{false};
  std::atomic<int> reclaims_{0};
  std::thread thread_;
};

// A request whose waiters may run the loop through baton; driving completes it.
std::shared_ptr<RequestState> driven_request(FakeLoop& loop, const std::shared_ptr<LoopBaton>& baton,
                                             uint64_t version) {
  auto request = std::make_shared<RequestState>(version, nullptr);
  request->set_spin(5000 * kMs, baton);
  loop.target = request;
  return request;
}

bool eventually(const std::function<bool()>& cond, int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

}  // namespace

TEST_CASE("a waiter runs the lent loop and completes its own op on its own thread", "[baton]") {
  FakeLoop loop;
  // A park far longer than the test: only a wake-up brings the loop back early.
  auto baton = std::make_shared<LoopBaton>(&loop, 60000 * kMs);
  auto request = driven_request(loop, baton, 1);
  FakeIoThread io(baton, &loop);
  Status s;
  REQUIRE(request->wait_for(10000, &s));
  CHECK(s.message() == "driven");
  CHECK(loop.drives == 1);
  CHECK(loop.driver_thread == std::this_thread::get_id());
  // Nothing left in the loop: the I/O thread is not woken and stays parked.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(io.reclaims() == 0);
}

TEST_CASE("the I/O thread takes the loop back at once when the waiter left work", "[baton]") {
  FakeLoop loop;
  loop.leave_work = true;
  auto baton = std::make_shared<LoopBaton>(&loop, 60000 * kMs);
  auto request = driven_request(loop, baton, 1);
  FakeIoThread io(baton, &loop);
  Status s;
  REQUIRE(request->wait_for(10000, &s));
  CHECK(loop.drives == 1);
  CHECK(eventually([&] { return io.reclaims() == 1; }, 10000));
}

TEST_CASE("work only the I/O thread may do is not starved by back-to-back waiters", "[baton]") {
  // Every wait here leaves the I/O thread something to do (user callbacks, in a peer),
  // and so wakes it. The next waiter asks for the loop within a microsecond of the
  // give-back, long before the woken I/O thread runs: it must not get the loop until the
  // I/O thread has had it.
  FakeLoop loop;
  loop.leave_work = true;
  loop.owe_io = true;
  auto baton = std::make_shared<LoopBaton>(&loop, 60000 * kMs);
  FakeIoThread io(baton, &loop);
  constexpr int kWaits = 200;
  for (int v = 1; v <= kWaits; ++v) {
    auto request = driven_request(loop, baton, static_cast<uint64_t>(v));
    REQUIRE(request->wait_for(10000, nullptr));
  }
  CHECK(loop.drives == kWaits);
  // The I/O thread had the loop after every wait, the last one included.
  CHECK(eventually([&] { return io.reclaims() == kWaits; }, 10000));
}

TEST_CASE("a parked I/O thread takes an unused loop back after its park", "[baton]") {
  FakeLoop loop;
  auto baton = std::make_shared<LoopBaton>(&loop, 2 * kMs);
  auto request = driven_request(loop, baton, 1);
  FakeIoThread io(baton, &loop);
  Status s;
  REQUIRE(request->wait_for(10000, &s));
  CHECK(eventually([&] { return io.reclaims() == 1; }, 10000));
  // Taken back, it lends again to the next waiter.
  auto second = driven_request(loop, baton, 2);
  REQUIRE(second->wait_for(10000, &s));
  CHECK(loop.drives == 2);
}

TEST_CASE("a wait's timeout covers the loop it runs and the sleep after it", "[baton]") {
  // The fake loop runs until the wait's own deadline (a real one goes on while it makes
  // progress); the sleep after it must not start a second timeout.
  FakeLoop loop;
  auto baton = std::make_shared<LoopBaton>(&loop, 60000 * kMs);
  auto request = std::make_shared<RequestState>(1, nullptr);
  request->set_spin(5000 * kMs, baton);
  FakeIoThread io(baton, &loop);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(request->wait_for(1000, nullptr));
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(loop.drives == 1);
  CHECK(waited >= std::chrono::milliseconds(1000));
  // A second timeout would make it at least 2000 ms; the bound leaves 900 ms for the
  // scheduler, which a busy I/O thread and a sanitizer on two loaded cores can take.
  CHECK(waited < std::chrono::milliseconds(1900));
}

TEST_CASE("a closed baton is never taken; its waiters fall back to sleeping", "[baton]") {
  FakeLoop loop;
  auto baton = std::make_shared<LoopBaton>(&loop, kMs);
  baton->close();
  auto request = std::make_shared<RequestState>(1, nullptr);
  request->set_spin(50 * kMs, baton);
  loop.target = request;
  std::thread completer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    request->complete({});
  });
  Status s;
  REQUIRE(request->wait_for(10000, &s));
  completer.join();
  CHECK(s.is_ok());
  CHECK(loop.drives == 0);
  CHECK_FALSE(baton->wanted());
}

TEST_CASE("no completion is missed while waiters take turns running the loop", "[baton]") {
  // Many waiters on one baton, each on its own request, completed in turn by another
  // thread; drivers stop at tiny and large windows, leaving work or not, so the give-back,
  // the park and the fall-back to the condition variable all race with completion.
  FakeLoop loop;
  auto baton = std::make_shared<LoopBaton>(&loop, 50000);
  FakeIoThread io(baton, &loop);
  const uint64_t windows[] = {0, 1000, 20000, 500000};
  auto race = race_waiters(200, 6, [&](int round, int i, RequestState& r) {
    loop.leave_work = round % 2 == 1;
    r.set_spin(windows[(round + i) % 4], baton);
  });
  CHECK(race.missed == 0);
  CHECK(race.wrong == 0);
  CHECK(loop.drives > 0);
  CHECK_FALSE(baton->wanted());
}

TEST_CASE("user callbacks wait in the installed list while a waiter runs the loop", "[baton]") {
  std::vector<std::string> ran;
  DeferredCallbacks deferred;
  {
    DeferUserCallbacks defer(&deferred);
    call_user_callback([&] { ran.push_back("deferred"); });
    {
      DeferredCallbacks inner;
      DeferUserCallbacks nested(&inner);
      call_user_callback([&] { ran.push_back("inner"); });
      CHECK(inner.size() == 1);
    }
    CHECK(deferred.size() == 1);
  }
  call_user_callback([&] { ran.push_back("inline"); });
  CHECK(ran == std::vector<std::string>{"inline"});
  for (auto& fn : deferred) fn();
  CHECK(ran == std::vector<std::string>{"inline", "deferred"});
}
