// Command line of taiji-run; see kUsage in run_options.cpp for the meaning of each option.
#pragma once

#include <string>
#include <vector>

namespace taiji_run {

struct HostEntry {
  std::string host;  // without [] around an IPv6 address
  int count = 0;
};

struct Options {
  int np = -1;
  std::vector<HostEntry> hosts;
  std::string self;
  int port = -1;
  std::string job_id;
  std::string store;              // --store: an etcd store instead of the one served here
  double timeout_s = 0;
  bool tag = true;
  bool generate_secret = false;  // --secret: a fresh job secret (single host)
  std::string secret_file;       // --secret-file: TAIJI_SECRET_FILE for every rank
  bool elastic = false;          // --elastic: follow membership changes (elastic_watch.h)
  int min_np = 1;                // --min-np, --max-np: the elastic job's limits
  int max_np = 1 << 20;
  int resize = -1;               // --resize N: the client mode, no ranks (see run_resize)
  std::vector<std::string> command;
};

// Parses and validates; prints the usage and exits with 2 on bad usage, 0 after --help.
// With --hosts, np is the sum of the counts and port defaults to 29400; without, port
// defaults to 0 (any free port). With --resize, command is empty.
Options parse_run_options(int argc, char** argv);

}  // namespace taiji_run
