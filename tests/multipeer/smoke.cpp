#include <cstdio>
#include <vector>
#include "harness.h"
int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 4;
  size_t count = argc > 2 ? strtoul(argv[2], nullptr, 10) : 1000;
  auto f = taiji_test::run_peers(n, [&](taiji_peer_t* p, int r) {
    std::vector<float> in(count, float(r + 1)), out(count, -1);
    for (int it = 0; it < 3; ++it) {
      taiji_status_t s = taiji_allreduce(p, "x", in.data(), out.data(), count, TAIJI_F32, TAIJI_SUM, nullptr, nullptr);
      if (s != TAIJI_OK) { printf("rank %d: %s %s\n", r, taiji_status_name(s), taiji_peer_last_error(p)); return; }
      float want = n * (n + 1) / 2.0f;
      for (size_t i = 0; i < count; ++i) if (out[i] != want) { printf("rank %d bad at %zu: %f\n", r, i, out[i]); return; }
    }
    taiji_status_t s = taiji_barrier(p, "b", nullptr, nullptr);
    if (s != TAIJI_OK) printf("barrier rank %d: %s %s\n", r, taiji_status_name(s), taiji_peer_last_error(p));
  });
  for (auto& x : f) printf("%s\n", x.c_str());
  printf("done %zu failures\n", f.size());
  return f.empty() ? 0 : 1;
}
