// Rounds of waiter threads, each on its own request, racing a thread that completes the
// requests in turn: a lost wake-up shows as a bounded wait that timed out, not a hung test.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/request.h"

namespace taiji_test {

struct RaceResult {
  int missed = 0;  // waits that timed out
  int wrong = 0;   // waits that returned another request's status
};

// prepare(round, i, request) sets up waiter i's request before the round shares it.
inline RaceResult race_waiters(int rounds, int waiters,
                               const std::function<void(int, int, taiji::RequestState&)>& prepare) {
  using taiji::Code;
  using taiji::RequestState;
  std::atomic<int> missed{0};
  std::atomic<int> wrong{0};
  for (int round = 0; round < rounds && missed == 0 && wrong == 0; ++round) {
    std::vector<std::shared_ptr<RequestState>> reqs;
    for (int i = 0; i < waiters; ++i) {
      reqs.push_back(std::make_shared<RequestState>(static_cast<uint64_t>(i + 1), nullptr));
      prepare(round, i, *reqs.back());
    }
    std::vector<std::thread> threads;
    for (int i = 0; i < waiters; ++i) {
      threads.emplace_back([&, i] {
        taiji::Status s;
        if (!reqs[i]->wait_for(10000, &s)) {
          ++missed;
        } else if (s.code() != Code::Mismatch || s.message() != std::to_string(i)) {
          ++wrong;
        }
      });
    }
    std::thread completer([&] {
      for (int i = 0; i < waiters; ++i) {
        if ((round + i) % 3 == 0) std::this_thread::yield();
        reqs[i]->complete({Code::Mismatch, std::to_string(i)});
      }
    });
    completer.join();
    for (auto& t : threads) t.join();
  }
  return {missed.load(), wrong.load()};
}

}  // namespace taiji_test
