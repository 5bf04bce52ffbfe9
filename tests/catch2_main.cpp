// The one Catch2 main every test program links (tests/meson.build).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  // A filter that matches no test fails the run: each meson test runs one tag, and a
  // misspelt or renamed tag would otherwise pass having run nothing.
  auto& config = session.configData();
  config.warnings = static_cast<Catch::WarnAbout::What>(config.warnings | Catch::WarnAbout::NoTests);
  return session.run();
}
