// taiji-run: starts the ranks of a taiji job on this host, serves (or points them at) the
// rendezvous store, prefixes their output with the rank, and stops the whole job as soon
// as one rank fails so that no peer is left waiting on a dead one.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "job_secret.h"
#include "launcher.h"
#include "bootstrap/rendezvous.h"

extern char** environ;

namespace taiji_run {

namespace {

constexpr auto kKillGrace = std::chrono::seconds(3);
constexpr size_t kMaxLine = 64 * 1024;  // a longer line is printed in pieces

// Resolved before forking, so that a typo fails once, up front, and the child only execs.
std::optional<std::string> find_program(const std::string& prog) {
  auto runnable = [](const std::string& p) {
    struct stat st{};
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
  };
  if (prog.find('/') != std::string::npos) {
    return runnable(prog) ? std::optional<std::string>(prog) : std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  for (;;) {
    size_t colon = dirs.find(':', start);
    std::string dir = dirs.substr(start, colon == std::string::npos ? colon : colon - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + prog;
    if (runnable(candidate)) return candidate;
    if (colon == std::string::npos) return std::nullopt;
    start = colon + 1;
  }
}

std::string bracketed(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

void write_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};  // an inherited non-blocking stdout
      poll(&p, 1, -1);
    } else {
      return;  // our own output is gone (closed pipe); the job itself carries on
    }
  }
}

}  // namespace

void say(const std::string& message) { write_all(2, "taiji-run: " + message + "\n"); }

int Launcher::running_count() const {
  int n = 0;
  for (const auto& c : children_) n += c.running;
  return n;
}

// A rank's whole process group, so that a shell wrapper's children stop with it; also the
// group of a rank that has exited already, whose children may live on. (An exited rank
// stays a zombie until the end, see reap(), so its group id cannot pass to another.)
void Launcher::stop(int sig, bool from_terminal) {
  stopping_ = true;
  for (auto& c : children_) {
    if (c.own_group) {
      kill(-c.pid, sig);
    } else if (c.running && !from_terminal) {
      kill(c.pid, sig);
    }
  }
  if (sig != SIGKILL && !kill_at_) kill_at_ = Clock::now() + kKillGrace;
}

// Only the ranks themselves: a shell wrapper would die of a signal it does not handle.
void Launcher::notify(int sig) {
  for (auto& c : children_) {
    if (c.running) kill(c.pid, sig);
  }
}

void Launcher::kill_leftovers() {
  for (auto& c : children_) {
    if (c.own_group) kill(-c.pid, SIGKILL);
    // Only now: a reaped rank's pid, and with it its group id, could go to another process.
    waitpid(c.pid, nullptr, 0);
  }
}

// Prints every complete line the pipe holds, in one write per call so that a chatty rank
// costs few syscalls; at EOF (or in the final drain) the unterminated rest too, given a
// newline so that it is not glued to another rank's next line. An overlong line is cut
// into pieces; tagged, each piece becomes a line of its own.
void Launcher::pump(Stream& s, int rank, bool final_drain) {
  const std::string prefix = opts_.tag ? "[" + std::to_string(rank) + "] " : "";
  std::string out;
  auto take = [&](size_t len, bool add_newline) {
    out += prefix;
    out.append(s.buf, 0, len);
    if (add_newline) out.push_back('\n');
    s.buf.erase(0, len);
  };
  char chunk[16 * 1024];
  bool eof = false;
  // Bounded, so that a rank (or a grandchild holding its pipe) writing without pause can
  // neither starve the others nor hold up the exit; the final drain covers a full pipe.
  for (int reads = 0; reads < (final_drain ? 64 : 8); ++reads) {
    ssize_t n = read(s.fd, chunk, sizeof(chunk));
    if (n > 0) {
      s.buf.append(chunk, static_cast<size_t>(n));
      size_t nl;
      while ((nl = s.buf.find('\n')) != std::string::npos) take(nl + 1, false);
      while (s.buf.size() >= kMaxLine) take(kMaxLine, opts_.tag);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    eof = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    break;
  }
  bool done = eof || final_drain;
  if (done && !s.buf.empty()) take(s.buf.size(), true);
  write_all(s.out_fd, out);
  if (done) {
    close(s.fd);
    s.fd = -1;
  }
}

// Notes ranks that have ended but leaves them zombies (WNOWAIT): kill_leftovers reaps them.
void Launcher::reap() {
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
    if (!c.running) continue;
    siginfo_t si{};
    if (waitid(P_PID, static_cast<id_t>(c.pid), &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid != c.pid) {
      continue;
    }
    c.running = false;
    const bool exited = si.si_code == CLD_EXITED;
    const int status = si.si_status;  // the exit code, or the signal that ended it
    bool failed = !exited || status != 0;
    int code = exited ? status : 128 + status;
    std::string what = exited ? "exited with code " + std::to_string(code)
                              : "killed by signal " + std::to_string(status) + " (" + strsignal(status) + ")";
    if (across_hosts()) {
      hosts_ended(i, failed, code, what);
      continue;
    }
    if (opts_.elastic && !stopping_) {
      elastic_ended(i, failed, code, what);
      continue;
    }
    if (!failed || stopping_) continue;
    int left = running_count();
    say("rank " + std::to_string(c.rank) + " " + what +
        (left > 0 ? "; stopping the other " + others(left) : ""));
    exit_code_ = code;
    stop(SIGTERM);
  }
}

bool Launcher::spawn(int rank, int local_rank, int local_size, const std::string& path,
                     const std::map<std::string, std::string>& vars) {
  // Everything the child needs is built here: between fork and exec only
  // async-signal-safe calls are allowed (the rendezvous thread may hold malloc's lock).
  std::map<std::string, std::string> own = vars;
  own["TAIJI_RANK"] = std::to_string(rank);
  own["TAIJI_LOCAL_RANK"] = std::to_string(local_rank);
  own["TAIJI_LOCAL_SIZE"] = std::to_string(local_size);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    if (own.count(entry.substr(0, entry.find('='))) == 0) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : own) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (auto& s : opts_.command) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::string exec_failed = "taiji-run: cannot execute " + path + "\n";

  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return false;
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    for (int fd : out_pipe) close(fd);
    return false;
  }
  pid_t parent = getpid();
  // Each rank leads a group of its own, but for a rank 0 that reads the terminal we run
  // in the foreground of: a background group reading it would be stopped (SIGTTIN).
  const bool own_group = rank != 0 || !isatty(0) || tcgetpgrp(0) != getpgrp();
  pid_t pid = fork();
  if (pid == 0) {
    if (own_group) setpgid(0, 0);
    // If taiji-run dies (even by SIGKILL), the ranks must not linger; the getppid check
    // covers a parent that died before prctl took effect.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    if (ranks_nofile_) setrlimit(RLIMIT_NOFILE, &*ranks_nofile_);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGPIPE, SIGINT, SIGTERM}) signal(s, SIG_DFL);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    if (rank != 0) {  // one terminal reader at most
      int null_fd = open("/dev/null", O_RDONLY);
      if (null_fd >= 0) dup2(null_fd, 0);
    }
    execve(path.c_str(), argv.data(), envp.data());
    [[maybe_unused]] ssize_t n = write(2, exec_failed.data(), exec_failed.size());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (pid < 0) {
    for (int fd : {out_pipe[0], err_pipe[0]}) close(fd);
    return false;
  }
  // Here too, so that the group exists before any stop() (whichever of the two runs first).
  if (own_group) setpgid(pid, pid);
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  children_.push_back({rank, pid, true, {out_pipe[0], 1, {}}, {err_pipe[0], 2, {}}, own_group});
  children_.back().slot = local_rank;
  if (across_hosts()) {
    said_waiting_ = false;
    if (claims_) {
      auto n = claims_->add_running(1);
      if (!n.is_ok()) say("elastic: cannot count rank " + std::to_string(rank) + " in: " + n.status().message());
    }
  } else if (opts_.elastic) {
    members_.push_back(children_.size() - 1);
  }
  return true;
}

int Launcher::run() {
  auto path = find_program(opts_.command[0]);
  if (!path) {
    say(opts_.command[0] + ": command not found");
    return 127;
  }
  path_ = *path;
  // Every rank of the job holds a connection to the rendezvous store while it starts, and
  // the store serves at most half the descriptor limit at once: up to the hard limit here.
  // The ranks start with the limit this process was given.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    ranks_nofile_ = nofile;
    nofile.rlim_cur = nofile.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) ranks_nofile_.reset();
  }

  // Blocked before the rendezvous thread exists, so that it inherits the mask and all of
  // these end up in the signalfd. Blocked signals are queued even when inherited as
  // ignored (a script's background job), so SIGINT still stops the job; an ignored SIGHUP
  // (nohup) stays ignored, for the ranks too.
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGQUIT, SIGUSR1, SIGUSR2}) sigaddset(&handled, s);
  if (signal(SIGHUP, SIG_DFL) != SIG_IGN) sigaddset(&handled, SIGHUP);
  else signal(SIGHUP, SIG_IGN);
  sigprocmask(SIG_BLOCK, &handled, nullptr);
  signal(SIGPIPE, SIG_IGN);
  int sig_fd = signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sig_fd < 0) {
    say(std::string("signalfd: ") + std::strerror(errno));
    return 1;
  }

  // An elastic job may start with fewer ranks than --hosts has slots: they fill the hosts
  // in order, and the rest of each host's count is free for the ranks a grow adds.
  int first_rank = 0, local_size = opts_.np, starting = opts_.np;
  std::string rdv_host = "127.0.0.1", listen_host = "127.0.0.1";
  bool serve = true;
  if (!opts_.hosts.empty()) {
    rdv_host = opts_.hosts[0].host;
    listen_host = opts_.self;
    serve = opts_.hosts[0].host == opts_.self;
    for (const auto& h : opts_.hosts) {
      if (h.host == opts_.self) {
        local_size = h.count;
        starting = std::clamp(opts_.np - first_rank, 0, h.count);
        break;
      }
      first_rank += h.count;
    }
  }
  if (!opts_.store.empty()) serve = false;
  std::unique_ptr<taiji::RendezvousServer> server;
  uint16_t port = static_cast<uint16_t>(opts_.port);
  if (serve) {
    auto r = taiji::RendezvousServer::start(rdv_host, port);
    if (!r.is_ok()) {
      say("cannot serve the rendezvous: " + r.status().message());
      return 1;
    }
    server = std::move(r.value());
    port = server->port();
  }

  std::map<std::string, std::string>& vars = vars_;
  vars["TAIJI_WORLD_SIZE"] = std::to_string(opts_.np);
  vars["TAIJI_RENDEZVOUS"] =
      opts_.store.empty() ? bracketed(rdv_host) + ":" + std::to_string(port) : opts_.store;
  vars["TAIJI_RENDEZVOUS_HOST"] = "0";
  vars["TAIJI_JOB_ID"] = !opts_.job_id.empty() ? opts_.job_id
                                               : "job-" + std::to_string(getpid()) + "-" +
                                                     std::to_string(std::time(nullptr));
  std::optional<taiji_run::JobSecret> secret;
  if (opts_.generate_secret) {
    secret.emplace();
    if (!secret->error().empty()) {
      say(secret->error());
      return 1;
    }
    vars["TAIJI_SECRET_FILE"] = secret->path();
  } else if (!opts_.secret_file.empty()) {
    vars["TAIJI_SECRET_FILE"] = opts_.secret_file;
  }
  // A single-host job respects an explicit choice (e.g. an interface for a container);
  // with --hosts the address other hosts reach this one at is --self by definition.
  if (!opts_.hosts.empty() || std::getenv("TAIJI_LISTEN_HOST") == nullptr) {
    vars["TAIJI_LISTEN_HOST"] = listen_host;
  }
  // Declared after the server, so that the thread is stopped before the store it watches.
  std::unique_ptr<taiji_run::ElasticWatch> watch;
  if (opts_.elastic) {
    vars["TAIJI_CLUSTER_VERSION"] = "1";
    const std::string& address = vars["TAIJI_RENDEZVOUS"];
    const std::string& job = vars["TAIJI_JOB_ID"];
    auto w = taiji_run::ElasticWatch::start(address, job, opts_, 10000);
    if (!w.is_ok()) {
      say("elastic: cannot use the store at " + address + ": " + w.status().message());
      return 1;
    }
    watch = std::move(w.value());
    say("elastic job " + job + ", store " + address + " (resize with: taiji-run --resize N --store " +
        address + " --job-id " + job + ")");
    if (across_hosts()) {
      auto c = taiji_run::ElasticClaims::open(address, job, 10000);
      if (!c.is_ok()) {
        say("elastic: cannot use the store at " + address + ": " + c.status().message());
        return 1;
      }
      claims_ = std::move(c.value());
      slots_ = local_size;
      cluster_size_ = opts_.np;
    }
  }

  for (int i = 0; i < starting; ++i) {
    if (!spawn(first_rank + i, i, local_size, *path, vars)) {
      std::string why = std::strerror(errno);
      say("cannot start rank " + std::to_string(first_rank + i) + ": " + why +
          (running_count() > 0 ? "; stopping the other " + others(running_count()) : ""));
      exit_code_ = 1;
      stop(SIGTERM);
      break;
    }
  }

  std::optional<Clock::time_point> job_deadline;
  if (opts_.timeout_s > 0) {
    job_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(opts_.timeout_s));
  }
  std::vector<pollfd> fds;
  std::vector<std::pair<Stream*, int>> streams;
  while (running_count() > 0 || job_goes_on()) {
    fds.assign(1, {sig_fd, POLLIN, 0});
    if (watch) fds.push_back({watch->fd(), POLLIN, 0});
    const size_t first_stream = fds.size();
    streams.clear();
    for (auto& c : children_) {
      for (Stream* s : {&c.out, &c.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.emplace_back(s, c.rank);
      }
    }
    std::optional<Clock::time_point> wake;
    if (kill_at_) wake = kill_at_;
    if (detached_stop_at_ && !stopping_) wake = wake ? std::min(*wake, *detached_stop_at_) : *detached_stop_at_;
    if (job_deadline && !stopping_) wake = wake ? std::min(*wake, *job_deadline) : *job_deadline;
    if (running_count() == 0 && next_count_check_) {
      wake = wake ? std::min(*wake, *next_count_check_) : *next_count_check_;
    }
    int timeout = -1;
    if (wake) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*wake - Clock::now()).count();
      timeout = static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
    }
    int rc = poll(fds.data(), fds.size(), timeout);
    if (rc < 0 && errno != EINTR) {
      say(std::string("poll: ") + std::strerror(errno));
      stop(SIGKILL);
      exit_code_ = exit_code_.value_or(1);
    }
    for (size_t i = first_stream; rc > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0) {
        pump(*streams[i - first_stream].first, streams[i - first_stream].second, false);
      }
    }
    signalfd_siginfo si{};
    while (read(sig_fd, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
      int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) continue;
      const char* abbrev = sigabbrev_np(sig);
      std::string name = std::string("SIG") + (abbrev != nullptr ? abbrev : "?");
      if (sig == SIGUSR1 || sig == SIGUSR2) {
        // The ranks' to act on (a scheduler's warning before preemption, say); the job
        // goes on unless they end.
        say("received " + name + "; forwarding it to " + others(running_count()));
        notify(sig);
      } else if (stopping_) {
        say("received " + name + " while stopping; killing " + others(running_count()));
        stop(SIGKILL);
      } else {
        say("received " + name + "; forwarding it to " + others(running_count()));
        exit_code_ = 128 + sig;
        // A rank in our own process group got a key press's signal from the terminal
        // already: a second one would read as a second Ctrl-C (force quit, to some).
        stop(sig, si.ssi_code == SI_KERNEL);
      }
    }
    reap();
    if (watch && rc > 0 && fds[1].revents != 0) {
      for (auto& e : watch->take()) {
        if (e.membership && across_hosts()) hosts_change(*e.membership);
        else if (e.membership) elastic_change(*e.membership);
        else say("elastic: " + e.message);
      }
    }
    auto now = Clock::now();
    // A detached rank may still be finishing its own last lines when the members end: it
    // gets the same grace a stopped rank gets before it is told to stop.
    if (watch && !across_hosts() && !stopping_ && running_members() == 0 && running_count() > 0) {
      if (!detached_stop_at_) detached_stop_at_ = now + kKillGrace;
      if (now >= *detached_stop_at_) {
        say("the job's ranks have ended; stopping " + others(running_count()) + " detached and still running " +
            std::to_string(std::chrono::seconds(kKillGrace).count()) + " s later");
        stop(SIGTERM);
      }
    }
    if (job_deadline && !stopping_ && now >= *job_deadline &&
        (running_count() > 0 || across_hosts())) {
      char secs[32];
      std::snprintf(secs, sizeof(secs), "%g", opts_.timeout_s);
      say(std::string("timeout: the job is still running after ") + secs + " s; stopping " +
          others(running_count()));
      exit_code_ = 124;
      stop(SIGTERM);
    }
    if (kill_at_ && now >= *kill_at_ && running_count() > 0) {
      say(others(running_count()) + " still running " +
          std::to_string(std::chrono::seconds(kKillGrace).count()) +
          " s after being told to stop; killing");
      kill_at_.reset();
      stop(SIGKILL);
    }
  }
  kill_leftovers();
  // A rank's own output is all in its pipes once it has exited; a pipe kept open by a
  // grandchild must not hold up the exit, so take only what is there now.
  for (auto& c : children_) {
    for (Stream* s : {&c.out, &c.err}) {
      if (s->fd >= 0) pump(*s, c.rank, true);
    }
  }
  close(sig_fd);
  // Across hosts, a launcher knows no membership: its last process's status stands for it.
  return exit_code_.value_or(last_end_.value_or(0));
}

}  // namespace taiji_run

int main(int argc, char** argv) {
  taiji_run::Options opts = taiji_run::parse_run_options(argc, argv);
  if (opts.resize > 0) return taiji_run::run_resize(opts);
  taiji_run::Launcher launcher(std::move(opts));
  return launcher.run();
}
