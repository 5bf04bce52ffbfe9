#!/usr/bin/python3
"""Result rows of bench/compare/run.sh.

  results.py taiji CASE JSON CPU_N CPU_1 ITERS   one row from a taiji-bench --json file;
      the CPU cost per op is (CPU_N - CPU_1) / (ITERS - 1): the CPU seconds (summed over
      ranks) of a run with ITERS timed iterations minus those of a run with one, so start-up,
      warm-up and checks cancel out
  results.py tag CASE < lines                    adds "case" to a peer's JSON lines
  results.py table RESULTS.jsonl OUT_PREFIX [RATE]  prints the table; writes
      OUT_PREFIX.csv/.json; RATE (tc syntax, e.g. 1gbit): the netns link rate, to give
      the netns rows' busbw as a fraction of it

Every row is one JSON object: case, impl (taiji, gloo, mpi, torch), algo, op, world_size,
size_bytes, iters, time_us (median over iterations of the slowest rank), busbw_gbps
(nccl-tests: allreduce algbw * 2(n-1)/n, broadcast algbw), cpu_s_per_op (summed over
ranks), check.
"""
import csv
import json
import statistics
import sys

IMPLS = ["taiji", "gloo", "mpi", "torch"]


def taiji_row(case, path, cpu_n, cpu_1, iters):
    with open(path) as f:
        doc = json.load(f)
    iters = int(iters)
    cpu = (float(cpu_n) - float(cpu_1)) / (iters - 1) if iters > 1 else None
    for r in doc["rows"]:
        print(json.dumps({
            "case": case, "impl": "taiji", "algo": doc.get("topology") or "default",
            "op": doc["op"], "dtype": doc.get("dtype", "f32"), "world_size": doc["world_size"],
            "size_bytes": r["size_bytes"], "iters": r["iters"], "warmup": r["warmup"],
            "time_us": r["time_us"], "min_us": r["min_us"], "algbw_gbps": r["algbw_gbps"],
            "busbw_gbps": r["busbw_gbps"], "cpu_s_per_op": cpu,
            "check": r["check"] or "-"}))


def tag(case):
    for line in sys.stdin:
        line = line.strip()
        if line.startswith("{"):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # cut off by a killed run
            row["case"] = case
            print(json.dumps(row))


def fmt_size(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def best_rows(rows):
    """One row per (case, op, n, size, impl): per algorithm the median over the rounds of
    the time (bandwidths follow from it) and of the CPU cost, then the fastest algorithm
    (Gloo reports several). Wrong results are left out."""
    rounds = {}
    for r in rows:
        if r.get("check") != "FAIL":
            key = (r["case"], r["op"], r["world_size"], r["size_bytes"], r["impl"], r["algo"])
            rounds.setdefault(key, []).append(r)
    best = {}
    for key, rs in rounds.items():
        rs = sorted(rs, key=lambda r: r["time_us"])
        r = dict(rs[(len(rs) - 1) // 2])
        # An even number of rounds: the mean of the middle two, not the faster one.
        median_us = statistics.median(x["time_us"] for x in rs)
        if r["time_us"] > 0 and median_us != r["time_us"]:
            scale = r["time_us"] / median_us
            for field in ("algbw_gbps", "busbw_gbps"):
                if r.get(field) is not None:
                    r[field] *= scale
            r["time_us"] = median_us
        cpus = [x["cpu_s_per_op"] for x in rs if x.get("cpu_s_per_op") is not None]
        r["cpu_s_per_op"] = statistics.median(cpus) if cpus else None
        r["rounds"] = len(rs)
        k = key[:5]
        if k not in best or r["time_us"] < best[k]["time_us"]:
            best[k] = r
    return best


def link_gbps(rate):
    """tc's rate syntax (1gbit, 250mbit) in GB/s; None if it is not one."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1}
    for u, scale in units.items():
        if rate.endswith(u):
            try:
                return float(rate[:-len(u)]) * scale / 8 / 1e9
            except ValueError:
                return None
    return None


def table(path, prefix, rate=None):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    failed = [r for r in rows if r.get("check") == "FAIL"]
    best = best_rows(rows)
    groups = []
    for (case, op, n, size, _impl) in best:
        if (case, op, n, size) not in groups:
            groups.append((case, op, n, size))
    impls = [i for i in IMPLS if any(k[4] == i for k in best)]
    out = []
    for g in groups:
        case, op, n, size = g
        latency = op == "barrier" or size <= 4096
        entry = {"case": case, "op": op, "world_size": n, "size_bytes": size,
                 "rounds": max(best[g + (i,)]["rounds"] for i in IMPLS if g + (i,) in best),
                 "metric": "time_us" if latency else "busbw_gbps"}
        for i in impls:
            r = best.get(g + (i,))
            if r is None:
                continue
            entry[i] = r["time_us"] if latency else r["busbw_gbps"]
            if i == "gloo":
                entry["gloo_algo"] = r["algo"]
            cpu = r.get("cpu_s_per_op")
            if cpu:
                # Latency rows: CPU microseconds per op; bandwidth rows: GB reduced (or
                # broadcast) per CPU-second.
                entry[i + "_cpu"] = cpu * 1e6 if latency else size / cpu / 1e9
        t = entry.get("taiji")
        for i in impls[1:]:
            v = entry.get(i)
            if t and v:
                entry["taiji/" + i] = v / t if latency else t / v
        out.append(entry)

    algo_col = ["gloo algo"] if "gloo" in impls else []
    cols = ["case", "op", "n", "size", "metric"] + impls + algo_col + \
        ["taiji/" + i for i in impls[1:]] + [i + " cpu" for i in impls]
    lines = [cols]
    for e in out:
        line = [e["case"], e["op"], str(e["world_size"]),
                "-" if e["op"] == "barrier" else fmt_size(e["size_bytes"]),
                "us" if e["metric"] == "time_us" else "GB/s"]
        for i in impls:
            v = e.get(i)
            line.append("-" if v is None else (f"{v:.1f}" if e["metric"] == "time_us" else f"{v:.3f}"))
        if algo_col:
            line.append(e.get("gloo_algo", "-"))
        for i in impls[1:]:
            v = e.get("taiji/" + i)
            line.append("-" if v is None else f"{v:.2f}x")
        for i in impls:
            v = e.get(i + "_cpu")
            line.append("-" if v is None else (f"{v:.0f}" if e["metric"] == "time_us" else f"{v:.2f}"))
        lines.append(line)
    widths = [max(len(line[c]) for line in lines) for c in range(len(cols))]
    for line in lines:
        print("  ".join(v.rjust(w) for v, w in zip(line, widths)))
    print("busbw in GB/s (nccl-tests), latency rows (4 B, 4 KiB and barrier) in us; taiji/X > 1:"
          " taiji faster.\ncpu: GB per CPU-second (bandwidth rows) or CPU us per op (latency"
          " rows), summed over ranks.")
    link = link_gbps(rate) if rate else None
    for e in out:
        if link and e["case"] == "netns" and e["metric"] == "busbw_gbps":
            e["link_gbps"] = link
            shares = ", ".join(f"{i} {e[i] / link:.0%}" for i in impls if e.get(i))
            print(f"netns {e['op']} {fmt_size(e['size_bytes'])}: busbw / link rate ({rate}):"
                  f" {shares}")
    for r in failed:
        print(f"WRONG RESULT: {r['impl']} {r.get('algo')} {r['case']} {r['op']} "
              f"{r['size_bytes']} B (left out of the table)")

    with open(prefix + ".json", "w") as f:
        json.dump({"rows": out, "raw": rows}, f, indent=1)
    with open(prefix + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows(lines[1:])
    return 1 if failed else 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "taiji" and len(sys.argv) == 7:
        taiji_row(*sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "tag":
        tag(sys.argv[2])
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "table":
        return table(*sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
