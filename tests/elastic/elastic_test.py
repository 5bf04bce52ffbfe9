#!/usr/bin/env python3
"""Elastic membership with real processes.

usage: elastic_test.py PEER-PROGRAM TAIJI-RUN SCENARIO embedded|etcd

Runs elastic_peer.c under `taiji-run --elastic` on the launcher's own store (embedded) or
on an etcd this script starts on loopback ports of its own (etcd), and checks what every
process printed:

  schedule        4 -> 2 -> 6 -> 3 -> 8, an exact allreduce before and after each resize;
                  joiners get the state by broadcast; every final rank agrees bitwise.
  alternate       20 resizes in a row, 4 -> 2 -> 4 -> ... -> 4.
  kill            kill -9 of one of 4 during a stream of allreduces: every survivor sees
                  PEER_LOST within 2 s, shrinks to 3 and goes on with exact results.
  kill-in-shrink  as kill, but a second rank is lost after it joined the shrink (stopped,
                  entered in the store's shrink record, then killed): the shrink fails on
                  every survivor with an error naming that rank, within its deadline.
  leave           one of 4 ranks finalizes and exits during the stream: the others shrink
                  past it at once (it left; nobody waits for it to join).
  mismatch        3 ranks propose different sizes: ERR_MISMATCH everywhere, nothing
                  changes, the next allreduce runs on the old membership.
  partial         2 of 4 ranks call resize, the others never do: the callers time out
                  within the deadline and keep the old membership.
  inflight        ops posted before a resize: one every rank posted finishes on the old
                  membership with the right sum, one only rank 0 posted fails with
                  ERR_ABORTED or ERR_PEER_LOST
                  (the others left the old membership), naming it; both requests stay valid; the new membership then works.
  grow-fails      a grow no process can join (--max-np): every member's resize fails
                  within its deadline; taiji_shrink starts the old membership again.
  hosts           two launchers as the hosts 127.0.0.1 and 127.0.0.2 (2 slots each) run one
                  job 4 -> 2 -> 4: the shrink detaches the second host's ranks, the grow
                  starts them there again (the only free slots); every rank agrees.
  stale           a process of cluster version 1 meets a peer of version 2 (its address
                  put under the new version's key): both refuse, naming both versions.

Every wait is bounded; on a failure the output of every process is printed.
"""
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "launcher"))
import store_tool  # noqa: E402  (the embedded store's wire format)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from free_port import free_port  # noqa: E402

PEER, RUN, SCENARIO, BACKEND = sys.argv[1:5]
JOB_LIMIT_S = 120
# The bounds below are scheduling allowances, not the runtime's deadlines; under a sanitizer
# (the sanitizer passes set TAIJI_TEST_QUICK) slowed processes share two cores.
SLACK = 2.5 if os.environ.get("TAIJI_TEST_QUICK", "0") not in ("", "0") else 1


class Etcd:
    """An etcd on free loopback ports with a data directory of its own."""

    def __init__(self):
        assert shutil.which("etcd"), "etcd is not installed: run scripts/setup.sh (it installs etcd-server)"
        self.dir = tempfile.mkdtemp(prefix="taiji-elastic-etcd-")
        client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
        self.url = client
        self.proc = subprocess.Popen(
            ["etcd", "--name", "t", "--data-dir", f"{self.dir}/data", "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer, "--initial-cluster", f"t={peer}"],
            stdout=subprocess.DEVNULL, stderr=open(f"{self.dir}/etcd.log", "w"))
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                    if b"true" in r.read():
                        return
            except OSError:
                pass
            assert self.proc.poll() is None, open(f"{self.dir}/etcd.log").read()
            assert time.monotonic() < deadline, "etcd did not become healthy within 20 s"
            time.sleep(0.1)

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def stop(self):
        self.proc.kill()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def b64(s):
    return base64.b64encode(s.encode()).decode()


class Store:
    """get/set of one key in the job's store, whichever backend it is."""

    def __init__(self, etcd, address, prefix):
        self.etcd, self.address, self.prefix = etcd, address, prefix

    def get(self, key):
        if self.etcd:
            kvs = self.etcd.post("/v3/kv/range", {"key": b64(f"{self.prefix}/{key}")}).get("kvs", [])
            return base64.b64decode(kvs[0]["value"]).decode() if kvs else None
        k = key.encode()
        reply = store_tool.call(self.address, b"W" + store_tool.struct.pack("<I", len(k)) + k +
                                store_tool.struct.pack("<IBI", 1000, 0, 1) + b"\0")
        return reply[1:].decode() if reply[0] else None

    def set(self, key, value):
        if self.etcd:
            self.etcd.post("/v3/kv/put", {"key": b64(f"{self.prefix}/{key}"), "value": b64(value)})
            return
        k, v = key.encode(), value.encode()
        store_tool.call(self.address, b"S" + store_tool.struct.pack("<I", len(k)) + k +
                        store_tool.struct.pack("<I", len(v)) + v)


class Job:
    """taiji-run --elastic over PEER, its output collected line by line."""

    started = 0

    def __init__(self, np, args, etcd=None, job="elastic", max_np=8):
        # A job id of its own: an etcd keeps an earlier job's keys, addresses included.
        Job.started += 1
        self.job = f"{job}-{os.getpid()}-{Job.started}"
        port = free_port()
        store = ["--port", str(port)]
        address = f"127.0.0.1:{port}"
        if etcd:
            store = ["--store", f"{etcd.url.replace('http://', 'etcd://')}/{self.job}"]
        self.store = Store(etcd, address, self.job)
        cmd = [RUN, "-np", str(np), "--elastic", "--max-np", str(max_np), "--job-id", self.job,
               "--timeout", str(JOB_LIMIT_S)] + store + [PEER] + args
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append(line.rstrip("\n"))

    def records(self, word):
        """Every line `word k=v ...` as a dict."""
        out = []
        with self.lock:
            lines = list(self.lines)
        for line in lines:
            m = re.match(r"^\[\d+\] " + word + r" (.*)$", line)
            if m:
                rec = dict(re.findall(r"(\w+)=(\S*)", m.group(1)))
                t = re.search(r" text=(.*)$", m.group(1))
                rec["text"] = t.group(1) if t else ""
                out.append(rec)
        return out

    def wait_for(self, what, pred, limit_s=30):
        limit_s *= SLACK
        deadline = time.monotonic() + limit_s
        while not pred():
            if time.monotonic() > deadline or self.proc.poll() is not None and not pred():
                self.fail(f"waited {limit_s} s for {what}")
            time.sleep(0.02)

    def finish(self, limit_s=JOB_LIMIT_S + 10):
        try:
            rc = self.proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.fail("the job did not end")
        self.reader.join(5)
        return rc

    def fail(self, why):
        if self.proc.poll() is None:
            self.proc.kill()
        with self.lock:
            print("\n".join(self.lines))
        raise SystemExit(f"FAIL ({SCENARIO}, {BACKEND}): {why}")

    def check(self, cond, why):
        if not cond:
            self.fail(why)


def check_finals(job, size, version):
    finals = job.records("final")
    job.check(len(finals) == size, f"{len(finals)} final lines, want {size}")
    job.check(sorted(int(f["rank"]) for f in finals) == list(range(size)), "final ranks not 0..size-1")
    job.check({f["version"] for f in finals} == {str(version)}, f"final versions {finals}")
    job.check(len({f["digest"] for f in finals}) == 1, "final states differ between ranks")
    job.check(all(s["ok"] == "1" for s in job.records("step")), "an allreduce was wrong")
    return finals


def run_schedule(etcd, start, sizes):
    job = Job(start, ["--sizes", ",".join(map(str, sizes)), "--timeout-ms", "20000"], etcd)
    rc = job.finish()
    job.check(rc == 0, f"taiji-run exited {rc}")
    check_finals(job, sizes[-1], len(sizes) + 1)
    resizes = job.records("resize")
    survivors = sum(min(a, b) for a, b in zip([start] + sizes, sizes))
    job.check(len(resizes) == survivors, f"{len(resizes)} resize lines, want {survivors}")
    detached = sum(max(a - b, 0) for a, b in zip([start] + sizes, sizes))
    job.check(len(job.records("detached")) == detached, "detached ranks")
    joiners = [s for s in job.records("start") if s["joined"] != "1"]
    job.check(len(joiners) == sum(max(b - a, 0) for a, b in zip([start] + sizes, sizes)), "joiners")
    ms = sorted(float(r["ms"]) for r in resizes)
    print(f"ok: {len(sizes)} resizes, {len(ms)} member-resizes, median {ms[len(ms) // 2]:.1f} ms, "
          f"max {ms[-1]:.1f} ms")


def pids(job):
    return {int(s["rank"]): int(s["pid"]) for s in job.records("start")}


def run_kill(etcd, in_shrink):
    timeout = "4000" if in_shrink else "20000"
    job = Job(4, ["--stream", "--after", "20", "--timeout-ms", timeout], etcd)
    job.wait_for("10 steps on every rank",
                 lambda: all(sum(1 for s in job.records("step") if s["rank"] == str(r)) >= 10 for r in range(4)))
    victim, second = 2, 1
    p = pids(job)
    if in_shrink:
        os.kill(p[second], signal.SIGSTOP)  # it cannot join the shrink by itself
    killed_at = time.time() * 1000
    os.kill(p[victim], signal.SIGKILL)
    survivors = [0, 3] if in_shrink else [0, 1, 3]
    job.wait_for("PEER_LOST on every survivor", lambda: len(job.records("lost")) >= len(survivors))
    for lost in job.records("lost"):
        late = float(lost["at"]) - killed_at
        job.check(late <= 2000 * SLACK, f"rank {lost['rank']} saw the loss {late:.0f} ms after the kill")
    if not in_shrink:
        rc = job.finish()
        job.check(rc == 0, f"taiji-run exited {rc}")
        shrinks = job.records("shrink")
        job.check(len(shrinks) == 3 and all(s["status"] == "TAIJI_OK" and s["size"] == "3" and
                                            s["version"] == "2" for s in shrinks), f"shrinks {shrinks}")
        check_finals(job, 3, 2)
        recovery = max(float(s["at"]) for s in shrinks) - killed_at
        print(f"ok: PEER_LOST at most {max(float(l['at']) for l in job.records('lost')) - killed_at:.0f} ms "
              f"after the kill; shrunk {recovery:.0f} ms after it")
        return
    # The second victim joins the shrink on paper, then dies before it starts the new membership.
    key = f"{job.job}/v1/shrink/0"
    job.wait_for("the survivors in the shrink record",
                 lambda: (job.store.get(key) or "").split()[1:] and
                 sorted((job.store.get(key) or "open").split()[1:]) == ["0", "3"], 10)
    record = job.store.get(key)
    job.check(record.startswith("open "), f"record {record}")
    job.store.set(key, record + f" {second}")
    time.sleep(0.2)
    os.kill(p[second], signal.SIGKILL)
    rc = job.finish()
    shrinks = job.records("shrink")
    job.check(len(shrinks) == 2, f"shrink lines {shrinks}")
    for s in shrinks:
        job.check(s["status"] != "TAIJI_OK", f"rank {s['rank']}'s shrink succeeded")
        job.check(float(s["ms"]) <= 4000 + 1500 * SLACK, f"rank {s['rank']}'s shrink took {s['ms']} ms")
        job.check(f"rank {second}" in s["text"], f"the error does not name rank {second}: {s['text']}")
    job.check(rc != 0, "the job did not fail")
    print(f"ok: the shrink failed on both survivors: {shrinks[0]['status']} {shrinks[0]['text']}")


def run_leave(etcd):
    # A rank that finalizes has left as much as a lost one: the others shrink past it at
    # once instead of waiting for it to join until their deadline.
    job = Job(4, ["--stream", "--after", "10", "--leave-rank", "1", "--timeout-ms", "20000"], etcd)
    rc = job.finish()
    job.check(rc == 0, f"taiji-run exited {rc}")
    job.check(len(job.records("leaving")) == 1, "rank 1 did not leave")
    shrinks = job.records("shrink")
    job.check(len(shrinks) == 3 and all(s["status"] == "TAIJI_OK" and s["size"] == "3" and s["version"] == "2"
                                        for s in shrinks), f"shrinks {shrinks}")
    job.check(max(float(s["ms"]) for s in shrinks) < 5000 * SLACK, f"the shrink waited: {shrinks}")
    check_finals(job, 3, 2)
    print(f"ok: rank 1 left; the others shrank in at most {max(float(s['ms']) for s in shrinks):.0f} ms")


def run_mismatch(etcd):
    job = Job(3, ["--propose", "4", "--timeout-ms", "10000"], etcd)
    rc = job.finish()
    job.check(rc == 0, f"taiji-run exited {rc}")
    got = job.records("proposed")
    job.check(len(got) == 3, "proposed lines")
    for g in got:
        job.check(g["status"] == "TAIJI_ERR_MISMATCH" and g["changed"] == "0" and g["size"] == "3" and
                  g["version"] == "1", f"rank {g['rank']}: {g}")
        job.check("rank 0: 4, rank 1: 5, rank 2: 6" in g["text"], g["text"])
    check_finals(job, 3, 1)
    print("ok: mismatch on every rank:", got[0]["text"])


def run_partial(etcd):
    job = Job(4, ["--partial", "--timeout-ms", "2000"], etcd)
    rc = job.finish()
    job.check(rc == 0, f"taiji-run exited {rc}")
    got = {g["rank"]: g for g in job.records("proposed")}
    for r in ("0", "1"):
        job.check(got[r]["status"] == "TAIJI_ERR_TIMEOUT", f"rank {r}: {got[r]}")
        job.check(1900 <= float(got[r]["ms"]) <= 2000 + 1500 * SLACK, f"rank {r} timed out after {got[r]['ms']} ms")
        job.check(got[r]["size"] == "4" and got[r]["version"] == "1", f"rank {r} changed: {got[r]}")
    check_finals(job, 4, 1)
    print("ok: the callers timed out and kept the membership:", got["0"]["text"])


def run_inflight(etcd):
    job = Job(3, ["--inflight", "--timeout-ms", "3000"], etcd)
    rc = job.finish()
    job.check(rc == 0, f"taiji-run exited {rc}")
    pending = job.records("pending")
    job.check(len(pending) == 3 and all(p["status"] == "TAIJI_OK" and p["sum"] == p["want"] == "6"
                                        for p in pending), f"pending {pending}")
    orphan = job.records("orphan")
    job.check(len(orphan) == 1 and orphan[0]["status"] in ("TAIJI_ERR_ABORTED", "TAIJI_ERR_PEER_LOST") and
              "elastic.orphan" in orphan[0]["text"], f"orphan {orphan}")
    check_finals(job, 2, 2)
    print("ok: the shared op finished, the orphan:", orphan[0]["text"])


def run_grow_fails(etcd):
    job = Job(2, ["--grow-fails", "--timeout-ms", "3000"], etcd, max_np=2)
    rc = job.finish()
    job.check(rc == 0, f"taiji-run exited {rc}")
    grows = job.records("grow")
    job.check(len(grows) == 2 and all(g["status"] != "TAIJI_OK" and g["async"] == g["status"] and
                                      "rank 2" in g["text"] for g in grows), f"grows {grows}")
    shrinks = job.records("shrink")
    # The failed grow published addresses under version 2: the rebuild takes version 3.
    job.check(len(shrinks) == 2 and all(s["status"] == "TAIJI_OK" and s["changed"] == "1" and s["size"] == "2"
                                        and s["version"] == "3" for s in shrinks), f"shrinks {shrinks}")
    check_finals(job, 2, 3)
    print("ok: the grow failed on both (", grows[0]["text"], "); the shrink rebuilt the membership")


def run_hosts(etcd):
    # Both launchers get the same command but --self; the first serves the store, or both
    # name the etcd.
    Job.started += 1
    name = f"hosts-{os.getpid()}-{Job.started}"
    port = free_port()
    store = (["--store", f"{etcd.url.replace('http://', 'etcd://')}/{name}"] if etcd
             else ["--port", str(port)])
    procs, outs = [], []
    for host in ("127.0.0.1", "127.0.0.2"):
        out = tempfile.TemporaryFile(mode="w+")
        cmd = [RUN, "--hosts", "127.0.0.1:2,127.0.0.2:2", "--self", host, "-np", "4", "--elastic",
               "--job-id", name, "--timeout", str(JOB_LIMIT_S)] + store + \
              [PEER, "--sizes", "2,4", "--timeout-ms", "20000"]
        procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT))
        outs.append(out)
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(JOB_LIMIT_S + 10))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(None)
    texts = []
    for out in outs:
        out.seek(0)
        texts.append(out.read())
    both = "\n".join(texts)

    def fail(why):
        print(both)
        raise SystemExit(f"FAIL (hosts, {BACKEND}): {why}")

    if rcs != [0, 0]:
        fail(f"the launchers exited {rcs}")
    finals = [dict(re.findall(r"(\w+)=(\S*)", m)) for m in re.findall(r"\] final (.*)", both)]
    if sorted(int(f["rank"]) for f in finals) != [0, 1, 2, 3] or {f["version"] for f in finals} != {"3"} \
            or len({f["digest"] for f in finals}) != 1:
        fail(f"final lines {finals}")
    joined = re.findall(r"\] start rank=(\d) size=4 version=3", texts[1])
    if sorted(joined) != ["2", "3"] or re.search(r"\] start rank=\d size=4 version=3", texts[0]):
        fail("the grow's ranks did not start on the second host only")
    if "ok=0" in both or both.count(" ok=1") < 4 * 3:
        fail("a wrong or missing allreduce")
    print("ok: 4 -> 2 -> 4 across two launchers; the grow's ranks 2 and 3 started on 127.0.0.2")


def run_stale(etcd):
    # No launcher: two processes, the driver moving their addresses between version keys.
    job = f"stale-{os.getpid()}"
    if etcd:
        rendezvous = f"{etcd.url.replace('http://', 'etcd://')}/{job}"
        store = Store(etcd, None, job)
        server = None
    else:
        port = free_port()
        rendezvous = f"127.0.0.1:{port}"
        server = subprocess.Popen([RUN, "-np", "1", "--port", str(port), "--job-id", "holder", "sleep", "30"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        store = Store(None, rendezvous, job)
    procs = []
    try:
        for rank, version in ((0, 2), (1, 1)):
            env = dict(os.environ, TAIJI_RANK=str(rank), TAIJI_WORLD_SIZE="2", TAIJI_RENDEZVOUS=rendezvous,
                       TAIJI_RENDEZVOUS_HOST="0", TAIJI_JOB_ID=job, TAIJI_CLUSTER_VERSION=str(version),
                       TAIJI_INIT_TIMEOUT_MS="5000")
            procs.append(subprocess.Popen([PEER, "--sizes", ""], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        deadline = time.monotonic() + 10
        moved = set()
        while len(moved) < 2 and time.monotonic() < deadline:
            for src, dst in ((f"{job}/v2/addr/0", f"{job}/addr/0"), (f"{job}/addr/1", f"{job}/v2/addr/1")):
                if dst not in moved:
                    try:
                        value = store.get(src)
                    except (SystemExit, OSError):
                        value = None
                    if value:
                        store.set(dst, value)
                        moved.add(dst)
            time.sleep(0.05)
        outs = [p.communicate(timeout=15)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if server:
            server.kill()
            server.wait()
    # The peer of version 2 refuses the stale one, naming both versions; the stale one is
    # told its connection was refused in the handshake, another cluster version among the causes.
    wants = [r"member of cluster version 1 where this membership is version 2", r"another cluster version"]
    for rank, (p, out, want) in enumerate(zip(procs, outs, wants)):
        if p.returncode == 0 or not re.search(want, out) or "init:" not in out:
            print("\n\n".join(outs))
            raise SystemExit(f"FAIL (stale): rank {rank} exited {p.returncode}; no init error with '{want}'")
    print("ok: refused both ways:\n" + "\n".join(o.strip().splitlines()[-1] for o in outs))


SCENARIOS = {
    "schedule": lambda etcd: run_schedule(etcd, 4, [2, 6, 3, 8]),
    "alternate": lambda etcd: run_schedule(etcd, 4, [2, 4] * 10),
    "kill": lambda etcd: run_kill(etcd, False),
    "kill-in-shrink": lambda etcd: run_kill(etcd, True),
    "leave": run_leave,
    "mismatch": run_mismatch,
    "partial": run_partial,
    "inflight": run_inflight,
    "grow-fails": run_grow_fails,
    "hosts": run_hosts,
    "stale": run_stale,
}


def main():
    etcd = Etcd() if BACKEND == "etcd" else None
    try:
        run = SCENARIOS.get(SCENARIO)
        if run is None:
            raise SystemExit(f"unknown scenario {SCENARIO}")
        run(etcd)
    finally:
        if etcd:
            etcd.stop()


if __name__ == "__main__":
    main()
