#!/bin/bash
# Soak: 4 local peers under taiji-run run allreduces of mixed sizes (4 B .. 16 MiB, several
# names and dtypes, async and blocking, every result checked exactly) for SECONDS (default
# 300). Each peer samples its resident memory (VmRSS in /proc/<pid>/status) after a ~20 s
# warm-up and after its last op. Prints a table; fails if any op failed or any peer's RSS
# ended more than 16 MiB above its post-warm-up value.
#   scripts/soak.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/soak.sh [SECONDS]   (a positive whole number, default 300)" >&2
  exit 2
fi
limit_kib=$((16 * 1024))

scripts/setup.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "soak: 4 peers, ${seconds} s of mixed allreduces"
# The run ends itself at the first round past SECONDS; the launcher's timeout only guards
# against a hang (a round takes well under a minute even on a loaded machine).
set +e
build/tools/taiji-run -np 4 --timeout $((seconds + 120)) \
  build/bench/soak/taiji-soak --seconds "$seconds" 2>&1 | tee "$log" | grep --line-buffered -v 'soak-rss'
status=${PIPESTATUS[0]}
set -e

python3 - "$log" "$limit_kib" "$status" <<'PY'
import re, sys
log, limit_kib, status = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = []
failures = []
for line in open(log, errors='replace'):
    if 'FAIL ' in line:
        failures.append(line.rstrip())
    if 'soak-rss ' in line:
        rows.append(dict(re.findall(r'(\w+)=(\S+)', line)))
rows.sort(key=lambda r: int(r['rank']))
mib = lambda kib: int(kib) / 1024
print(f"{'rank':>4} {'pid':>8} {'warm RSS MiB':>13} {'end RSS MiB':>12} {'growth MiB':>11} "
      f"{'peak MiB':>9} {'ops':>8} {'GiB':>7} {'failed':>6}")
bad = []
for r in rows:
    growth = int(r['end_kib']) - int(r['warm_kib'])
    print(f"{r['rank']:>4} {r['pid']:>8} {mib(r['warm_kib']):>13.1f} {mib(r['end_kib']):>12.1f} "
          f"{growth / 1024:>+11.1f} {mib(r['hwm_kib']):>9.1f} {r['ops']:>8} {r['gib']:>7} {r['failed']:>6}")
    if growth > limit_kib:
        bad.append(f"rank {r['rank']}: RSS grew {growth / 1024:.1f} MiB after the warm-up "
                   f"(limit {limit_kib // 1024} MiB)")
    if r['failed'] != '0':
        bad.append(f"rank {r['rank']}: {r['failed']} failed ops")
if len(rows) != 4:
    bad.append(f"{len(rows)} of 4 peers reported their memory")
if status != 0:
    bad.append(f"the job exited with status {status}")
bad += failures
if bad:
    print('soak: FAILED')
    for b in bad:
        print(f'  {b}')
    sys.exit(1)
print('soak: ok')
PY
