// Running a server out of file descriptors, for tests of what it does meanwhile: while a
// DescriptorLimit lives, the process cannot open one more descriptor (EMFILE), so a
// server's accept fails and its listener stays readable. Header-only; shared by the unit
// and monitor tests.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

namespace taiji_test {

class DescriptorLimit {
 public:
  // Lowers the soft limit to the lowest free descriptor: the next open, socket or accept
  // of any thread fails until this is destroyed.
  DescriptorLimit() {
    ok_ = getrlimit(RLIMIT_NOFILE, &saved_) == 0;
    const int probe = dup(0);
    if (!ok_ || probe < 0) {
      ok_ = false;
      return;
    }
    close(probe);
    rlimit lowered = saved_;
    lowered.rlim_cur = static_cast<rlim_t>(probe);
    ok_ = setrlimit(RLIMIT_NOFILE, &lowered) == 0;
  }
  ~DescriptorLimit() { restore(); }
  void restore() {
    if (ok_) setrlimit(RLIMIT_NOFILE, &saved_);
    ok_ = false;
  }
  bool ok() const { return ok_; }

  DescriptorLimit(const DescriptorLimit&) = delete;
  DescriptorLimit& operator=(const DescriptorLimit&) = delete;

 private:
  rlimit saved_{};
  bool ok_ = false;
};

// CPU time this process used so far, every thread together: a thread that spins shows here.
inline double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// CPU seconds the process's other threads use while this one sleeps for `ms`.
inline double cpu_while_sleeping(std::chrono::milliseconds ms) {
  const double before = process_cpu_seconds();
  std::this_thread::sleep_for(ms);
  return process_cpu_seconds() - before;
}

// Connects a socket opened before the limit to 127.0.0.1:port: it needs no new
// descriptor, and the connection completes in the server's listen backlog.
inline bool connect_loopback(int fd, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
}

// What happened while a client reached a server that had no descriptor to accept it with.
struct StarvedClient {
  bool limited = false;    // the limit took hold
  bool connected = false;  // the connection completed in the listen backlog
  bool sent = false;       // the request went out whole
  double cpu = 0;          // CPU seconds the process used during the wait
};

// Under a DescriptorLimit, connects `fd` (opened before) to 127.0.0.1:port, sends
// `request`, and waits `wait` while measuring the process's CPU; then lifts the limit.
// Nothing in here asserts: with no descriptor free, UndefinedBehaviorSanitizer's vptr
// check (it probes memory through a pipe) fails for any type it has not seen yet.
inline StarvedClient starve_server(int fd, uint16_t port, const std::string& request,
                                   std::chrono::milliseconds wait) {
  StarvedClient out;
  DescriptorLimit limit;
  out.limited = limit.ok();
  out.connected = connect_loopback(fd, port);
  out.sent = out.connected &&
             send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size());
  out.cpu = cpu_while_sleeping(wait);
  return out;
}

}  // namespace taiji_test
