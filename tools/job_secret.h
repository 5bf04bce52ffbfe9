// taiji-run --secret: a job secret made for one run.
#pragma once

#include <string>

namespace taiji_run {

// 32 random bytes, hex, in an owner-only temporary file (mkstemp creates it 0600) that is
// removed when the object is destroyed.
class JobSecret {
 public:
  // Empty path() and a message in error() when it could not be made.
  JobSecret();
  ~JobSecret();
  JobSecret(const JobSecret&) = delete;
  JobSecret& operator=(const JobSecret&) = delete;

  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }

 private:
  std::string path_;
  std::string error_;
};

}  // namespace taiji_run
