#include "job_secret.h"

#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace taiji_run {

JobSecret::JobSecret() {
  const char* dir = std::getenv("TMPDIR");
  std::string templ = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
                      "/taiji-secret-XXXXXX";
  int fd = mkstemp(templ.data());
  if (fd < 0) {
    error_ = "cannot create a secret file in " + templ + ": " + std::strerror(errno);
    return;
  }
  path_ = templ;
  unsigned char raw[32];
  std::string hex;
  bool ok = getrandom(raw, sizeof(raw), 0) == static_cast<ssize_t>(sizeof(raw));
  for (unsigned char b : raw) {
    const char* digits = "0123456789abcdef";
    hex += digits[b >> 4];
    hex += digits[b & 15];
  }
  hex += '\n';
  ok = ok && write(fd, hex.data(), hex.size()) == static_cast<ssize_t>(hex.size());
  close(fd);
  if (!ok) error_ = "cannot write the secret file " + path_ + ": " + std::strerror(errno);
}

JobSecret::~JobSecret() {
  if (!path_.empty()) unlink(path_.c_str());
}

}  // namespace taiji_run
