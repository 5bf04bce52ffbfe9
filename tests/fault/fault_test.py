#!/usr/bin/env python3
"""Fault tests with real processes.

usage: fault_test.py PEER-PROGRAM kill9|sigstop|sigstop-large|abort RANK

Starts 4 peers (fault_peer.c) as separate processes the way a foreign launcher would
(TAIJI_RANK, TAIJI_WORLD_SIZE, TAIJI_RENDEZVOUS; rank 0 serves the rendezvous), lets them
run a stream of allreduces, then hits RANK:

  kill9    SIGKILL. Every survivor's pending and later ops fail with TAIJI_ERR_PEER_LOST
           within 2 s of the kill; a blocking one's error text names the rank. Several
           jobs, killed at different points, with ops up to 1 MiB and up to 16 MiB.
  sigstop  SIGSTOP with a 3 s op deadline. Survivors' ops fail with TAIJI_ERR_TIMEOUT no
           earlier than half the deadline and no later than the deadline plus 1 s, counted
           both from the stop and from the op's post; then SIGCONT, and everyone exits.
           In sigstop-large every op is 16 MiB and RANK stops itself (raise(SIGSTOP)) just
           after posting one, so that the survivors are left with data queued for it;
           three jobs, stopped at different steps.
  abort    RANK calls taiji_peer_abort while two threads wait on one request and one is
           blocked in a collective: all wake with TAIJI_ERR_ABORTED within 1 s, the sticky
           error is TAIJI_ERR_ABORTED, finalize returns at once; the others lose RANK as
           with a kill.

Times are CLOCK_MONOTONIC in ms on both sides (time.monotonic() is that clock on Linux).
Every wait is bounded; on a failure all children are killed and their output printed.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'support'))
from free_port import free_port  # noqa: E402

N = 4
WARM_OPS = 20          # ops every peer completes before the fault
KILL_ROUNDS = 4        # jobs per kill scenario, each killed after more ops
LARGE_COUNT = 4 << 20  # elements of the largest op in the large runs (16 MiB of i32)
# Steps after which the stopping peer stops itself, one job each: the third of three async
# steps in a row (every 5th step is blocking), so three 16 MiB ops are coming its way.
STOP_AT_STEPS = (43, 38, 33)
OP_TIMEOUT_MS = 30000  # op deadline where the deadline must not be what ends the op
# The bounds below are scheduling allowances, not the runtime's deadlines. Under a sanitizer
# (the sanitizer passes set TAIJI_TEST_QUICK) four slowed processes share two cores, so the
# allowances grow; they stay far below OP_TIMEOUT_MS, so a bound still tells a prompt error
# from an op that ended on its deadline.
SLACK = 2.5 if os.environ.get('TAIJI_TEST_QUICK', '0') not in ('', '0') else 1
LOST_WITHIN_MS = int(2000 * SLACK)
STOP_TIMEOUT_MS = 3000
STOP_LIMIT_MS = int(STOP_TIMEOUT_MS + 1000 * SLACK)
ABORT_WAKES_MS = int(1000 * SLACK)
FINALIZE_MS = int(2000 * SLACK)  # "promptly": far below OP_TIMEOUT_MS
# A graceful close to a stopped peer cannot flush and closes hard after 2 s.
FINALIZE_NEXT_TO_STOPPED_MS = int(2000 + 2000 * SLACK)
START_ATTEMPTS = 3
# Set to print every peer's output also when the test passes.
VERBOSE = os.environ.get('TAIJI_FAULT_VERBOSE') == '1'

LOST = 'TAIJI_ERR_PEER_LOST'
TIMEOUT = 'TAIJI_ERR_TIMEOUT'
ABORTED = 'TAIJI_ERR_ABORTED'
FINALIZED = 'TAIJI_ERR_FINALIZED'
OK = 'TAIJI_OK'


class Failed(Exception):
    pass


def now_ms():
    return time.monotonic() * 1000.0


def parse(line):
    """'kind a=1 b=2 text=free text' -> (kind, {'a': '1', 'b': '2', 'text': 'free text'})."""
    kind, _, rest = line.partition(' ')
    head, sep, text = rest.partition('text=')
    fields = dict(re.findall(r'(\w+)=(\S*)', head))
    if sep:
        fields['text'] = text
    return kind, fields


class Peer:
    def __init__(self, rank, proc, out_path, err_path):
        self.rank = rank
        self.proc = proc
        self.out_path = out_path
        self.err_path = err_path

    def records(self, kind=None):
        with open(self.out_path, encoding='utf-8', errors='replace') as f:
            lines = [l.rstrip('\n') for l in f if l.endswith('\n')]
        parsed = [parse(l) for l in lines]
        return [fields for k, fields in parsed if kind is None or k == kind]

    def has(self, kind):
        return len(self.records(kind)) > 0

    def one(self, kind):
        found = self.records(kind)
        if len(found) != 1:
            raise Failed(f'rank {self.rank}: expected one "{kind}" line, found {len(found)}')
        return found[0]

    def ok_ops(self):
        return sum(1 for r in self.records('op') if r['status'] == OK)

    def release(self):
        """Lets a held peer go on to finalize."""
        try:
            self.proc.stdin.write(b'go\n')
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def wait_exit(self, limit_ms, what):
        try:
            return self.proc.wait(timeout=limit_ms / 1000.0)
        except subprocess.TimeoutExpired:
            raise Failed(f'rank {self.rank}: did not exit within {limit_ms} ms {what}') from None


class Job:
    def __init__(self, program, args_for_rank, size=N, env=None):
        self.program = program
        self.args_for_rank = args_for_rank
        self.size = size
        self.env = env or {}
        self.dir = tempfile.mkdtemp(prefix='taiji-fault-')
        self.peers = []
        self.attempt = 0

    def start(self):
        """Starts the peers; retries with another port if the job could not form."""
        for _ in range(START_ATTEMPTS):
            self._spawn()
            try:
                self.wait_until(self._all_ready, 45000, 'all peers joined the job')
                return
            except Failed as e:
                if not any(p.has('init-failed') or p.proc.poll() is not None for p in self.peers):
                    raise
                print(f'start attempt {self.attempt} failed ({e}); retrying on another port')
                self.dump()
                self.kill_all()
        raise Failed(f'the job did not form in {START_ATTEMPTS} attempts')

    def _spawn(self):
        self.attempt += 1
        port = free_port()
        base = {k: v for k, v in os.environ.items() if not k.startswith('TAIJI_')}
        self.peers = []
        for r in range(self.size):
            env = dict(base, **self.env, TAIJI_RANK=str(r), TAIJI_WORLD_SIZE=str(self.size),
                       TAIJI_RENDEZVOUS=f'127.0.0.1:{port}', TAIJI_JOB_ID=f'fault-{port}',
                       TAIJI_INIT_TIMEOUT_MS='30000')
            out = os.path.join(self.dir, f'{self.attempt}.{r}.out')
            err = os.path.join(self.dir, f'{self.attempt}.{r}.err')
            with open(out, 'wb') as o, open(err, 'wb') as e:
                proc = subprocess.Popen([self.program] + self.args_for_rank(r), env=env,
                                        stdin=subprocess.PIPE, stdout=o, stderr=e)
            self.peers.append(Peer(r, proc, out, err))

    def _all_ready(self):
        for p in self.peers:
            if p.has('init-failed') or (p.proc.poll() is not None and not p.has('ready')):
                raise Failed(f'rank {p.rank} failed to join (exit {p.proc.returncode})')
        return all(p.has('ready') for p in self.peers)

    def wait_until(self, predicate, limit_ms, what):
        deadline = now_ms() + limit_ms
        while True:
            if predicate():
                return
            if now_ms() > deadline:
                raise Failed(f'timed out after {limit_ms} ms waiting until {what}')
            time.sleep(0.01)

    def wait_warm(self, ops=WARM_OPS):
        def warm():
            for p in self.peers:
                if p.proc.poll() is not None:
                    raise Failed(f'rank {p.rank} exited early with {p.proc.returncode}')
            return all(p.ok_ops() >= ops for p in self.peers)
        self.wait_until(warm, 60000, f'every peer completed {ops} ops')

    def kill_all(self):
        for p in self.peers:
            if p.proc.poll() is None:
                try:
                    os.kill(p.proc.pid, signal.SIGCONT)
                    os.kill(p.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                print(f'rank {p.rank} (pid {p.proc.pid}) survived SIGKILL for 10 s')

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def dump(self):
        for p in self.peers:
            for path, label, keep in ((p.out_path, 'stdout', 60), (p.err_path, 'stderr', 30)):
                with open(path, encoding='utf-8', errors='replace') as f:
                    lines = f.read().splitlines()
                print(f'--- rank {p.rank} {label} ({len(lines)} lines, last {keep}) ---')
                for line in lines[-keep:]:
                    print(f'  {line}')


class Checks:
    """Collects every broken expectation, so one run reports all of them."""

    def __init__(self):
        self.problems = []

    def expect(self, cond, message):
        if not cond:
            self.problems.append(message)
        return cond

    def raise_if_any(self):
        if self.problems:
            raise Failed('\n'.join(self.problems))


def t(record, key):
    return float(record[key])


def stream_after(peer, checks, fault_ms):
    """Ops ended before the fault must be OK; returns those ended after it."""
    ops = peer.records('op')
    for r in ops:
        if t(r, 'end') < fault_ms:
            checks.expect(r['status'] == OK,
                          f'rank {peer.rank}: op {r["i"]} ({r["name"]}) ended {fault_ms - t(r, "end"):.1f} ms '
                          f'before the fault with {r["status"]}')
    return [r for r in ops if t(r, 'end') >= fault_ms]


def names_rank(text, rank):
    return re.search(rf'\brank {rank}\b', text or '') is not None


def check_lost(peer, checks, fault_ms, lost_rank, summary):
    """A survivor of a dead peer: pending and later ops fail with PEER_LOST, fast."""
    after = stream_after(peer, checks, fault_ms)
    failures = [r for r in after if r['status'] != OK]
    pending = [r for r in after if t(r, 'post') < fault_ms]
    for r in after:
        checks.expect(r['status'] in (OK, LOST),
                      f'rank {peer.rank}: op {r["i"]} after the fault ended with {r["status"]}, '
                      f'expected {LOST} (or {OK} if rank {lost_rank} had done its part)')
        late = t(r, 'end') - fault_ms
        checks.expect(late <= LOST_WITHIN_MS,
                      f'rank {peer.rank}: op {r["i"]} ({r["status"]}) ended {late:.1f} ms after the '
                      f'fault, limit {LOST_WITHIN_MS} ms')
        if r['mode'] == 'block' and r['status'] == LOST:
            checks.expect(names_rank(r['text'], lost_rank),
                          f'rank {peer.rank}: op {r["i"]} error text does not name rank {lost_rank}: '
                          f'"{r["text"]}"')
    checks.expect(len(failures) > 0, f'rank {peer.rank}: no op failed after the fault')
    checks.expect(peer.one('stream-end')['failed'] == LOST,
                  f'rank {peer.rank}: the stream ended with {peer.one("stream-end")["failed"]}')
    later = peer.records('later')
    checks.expect([r['mode'] for r in later] == ['async', 'block'],
                  f'rank {peer.rank}: later ops reported: {later}')
    for r in later:
        checks.expect(r['status'] == LOST,
                      f'rank {peer.rank}: later {r["mode"]} op ended with {r["status"]}, expected {LOST}')
        took = t(r, 'end') - t(r, 'post')
        checks.expect(took <= LOST_WITHIN_MS,
                      f'rank {peer.rank}: later {r["mode"]} op took {took:.1f} ms')
        if r['mode'] == 'block':
            checks.expect(names_rank(r['text'], lost_rank),
                          f'rank {peer.rank}: later blocking op error text does not name rank '
                          f'{lost_rank}: "{r["text"]}"')
    checks.expect(peer.one('async_error')['status'] == LOST,
                  f'rank {peer.rank}: async error {peer.one("async_error")["status"]}, expected {LOST}')
    if failures:
        first = min(t(r, 'end') for r in failures) - fault_ms
        summary.append(f'rank {peer.rank}: {len(pending)} ops pending at the fault; first {LOST} '
                       f'{first:.1f} ms after it; last op ended '
                       f'{max(t(r, "end") for r in after) - fault_ms:.1f} ms after it')


def check_exit(peer, checks, finalize_statuses, finalize_limit_ms, summary):
    fin = peer.one('finalize')
    checks.expect(fin['status'] in finalize_statuses,
                  f'rank {peer.rank}: finalize returned {fin["status"]}, expected {" or ".join(finalize_statuses)}')
    checks.expect(t(fin, 'took') <= finalize_limit_ms,
                  f'rank {peer.rank}: finalize took {t(fin, "took"):.1f} ms, limit {finalize_limit_ms} ms')
    destroy = peer.one('destroy')
    checks.expect(t(destroy, 'took') <= FINALIZE_MS,
                  f'rank {peer.rank}: destroy took {t(destroy, "took"):.1f} ms')
    checks.expect(peer.has('exit'), f'rank {peer.rank}: no exit line')
    checks.expect(peer.proc.returncode == 0, f'rank {peer.rank}: exit status {peer.proc.returncode}')
    summary.append(f'rank {peer.rank}: finalize {fin["status"]} in {t(fin, "took"):.1f} ms, '
                   f'destroy {t(destroy, "took"):.1f} ms')


def check_no_wrong(job, checks):
    for p in job.peers:
        wrong = p.records('WRONG')
        checks.expect(not wrong, f'rank {p.rank}: wrong allreduce results: {wrong[:3]}')


def release_and_wait(peers, limit_ms, what):
    for p in peers:
        p.release()
    for p in peers:
        p.wait_exit(limit_ms, what)


def scenario_kill9(program, victim, summary):
    for round in range(KILL_ROUNDS):
        large = round % 2 == 1
        warm = WARM_OPS * (round + 1)
        summary.append(f'job {round + 1}: ops up to {"16 MiB" if large else "1 MiB"}, '
                       f'killed after {warm} ops')
        kill9_once(program, victim, large, warm, summary)


def size_args(large):
    return ['--max-count', str(LARGE_COUNT)] if large else []


def kill9_once(program, victim, large, warm, summary):
    job = Job(program, lambda r: ['--timeout-ms', str(OP_TIMEOUT_MS), '--later'] + size_args(large))
    try:
        job.start()
        job.wait_warm(warm)
        v = job.peers[victim]
        survivors = [p for p in job.peers if p.rank != victim]
        fault = now_ms()
        os.kill(v.proc.pid, signal.SIGKILL)
        v.wait_exit(5000, 'after SIGKILL')
        job.wait_until(lambda: all(p.has('held') for p in survivors), 15000,
                       'every survivor reported its ops')
        checks = Checks()
        for p in survivors:
            check_lost(p, checks, fault, victim, summary)
        release_and_wait(survivors, 10000, 'after release')
        for p in survivors:
            check_exit(p, checks, [LOST], FINALIZE_MS, summary)
        check_no_wrong(job, checks)
        checks.raise_if_any()
        if VERBOSE:
            job.dump()
        return job
    except BaseException:
        job.dump()
        raise
    finally:
        job.kill_all()
        job.remove()


def process_state(pid):
    with open(f'/proc/{pid}/stat') as f:
        return f.read().rsplit(')', 1)[1].split()[0]


def scenario_sigstop_large(program, victim, summary):
    for round, step in enumerate(STOP_AT_STEPS):
        summary.append(f'job {round + 1}: 16 MiB ops, rank {victim} stops itself after posting step {step}')
        scenario_sigstop(program, victim, summary, stop_at=step)


def blames(text, rank):
    """Whether a timeout's text names `rank` as missing (never posted, had not posted, or
    did not answer), rather than only as a rank the op waited on for data."""
    for clause in (text or '').split('; '):
        m = re.match(r'rank\(s\) ([\d ]+) (never posted|had not posted|did not answer)', clause)
        if m and str(rank) in m.group(1).split():
            return True
    return False


def scenario_sigstop(program, victim, summary, stop_at=None, size=N, env=None, blame=False):
    large = stop_at is not None

    def args(r):
        a = ['--timeout-ms', str(STOP_TIMEOUT_MS)]
        if large:
            a += size_args(True) + ['--only-largest']
            if r == victim:
                a += ['--stop-at', str(stop_at)]
        return a
    job = Job(program, args, size, env)
    try:
        job.start()
        v = job.peers[victim]
        survivors = [p for p in job.peers if p.rank != victim]
        if large:
            job.wait_until(lambda: v.has('stop'), 60000, f'rank {victim} stopped itself')
            fault = t(v.one('stop'), 't')
        else:
            job.wait_warm()
            fault = now_ms()
            os.kill(v.proc.pid, signal.SIGSTOP)
        job.wait_until(lambda: process_state(v.proc.pid) == 'T', 2000, f'rank {victim} is stopped')
        job.wait_until(lambda: all(p.has('held') for p in survivors), STOP_TIMEOUT_MS + 15000,
                       'every survivor reported its ops')
        checks = Checks()
        half = STOP_TIMEOUT_MS / 2
        limit = STOP_LIMIT_MS
        for p in survivors:
            after = stream_after(p, checks, fault)
            timeouts = [r for r in after if r['status'] == TIMEOUT]
            for r in after:
                # A stopped peer may have been cut off mid-frame (its I/O thread starts an op
                # within microseconds of the post): a link stuck like that is dropped shortly
                # after the first op on it times out, and ops still pending then fail with
                # PEER_LOST. Either way nothing may end before half the deadline.
                checks.expect(r['status'] in (OK, TIMEOUT, LOST),
                              f'rank {p.rank}: op {r["i"]} after the stop ended with {r["status"]}, '
                              f'expected {TIMEOUT}')
                if r['status'] == LOST:
                    checks.expect(t(r, 'end') - fault >= half,
                                  f'rank {p.rank}: op {r["i"]} lost its peer only '
                                  f'{t(r, "end") - fault:.1f} ms after the stop, expected at least {half:.0f} ms')
                since_stop = t(r, 'end') - fault
                checks.expect(since_stop <= limit,
                              f'rank {p.rank}: op {r["i"]} ({r["status"]}) ended {since_stop:.1f} ms after '
                              f'the stop, limit {limit} ms')
                if r['status'] == TIMEOUT and blame:
                    checks.expect(blames(r['text'], victim),
                                  f'rank {p.rank}: op {r["i"]} timed out without naming rank {victim} '
                                  f'as missing: {r["text"]}')
                if r['status'] == TIMEOUT:
                    since_post = t(r, 'end') - t(r, 'post')
                    checks.expect(half <= since_post <= limit,
                                  f'rank {p.rank}: op {r["i"]} timed out {since_post:.1f} ms after its post, '
                                  f'expected {half:.0f}..{limit} ms')
                    checks.expect(half <= since_stop,
                                  f'rank {p.rank}: op {r["i"]} timed out only {since_stop:.1f} ms after the '
                                  f'stop, expected at least {half:.0f} ms')
            checks.expect(len(timeouts) > 0, f'rank {p.rank}: no op timed out after the stop')
            checks.expect(p.one('stream-end')['failed'] in (TIMEOUT, LOST),
                          f'rank {p.rank}: the stream ended with {p.one("stream-end")["failed"]}')
            # The deadline alone fails ops; but a link whose failed op still has data queued
            # to the stopped peer is dropped a second later, which may make the loss sticky.
            checks.expect(p.one('async_error')['status'] in (OK, LOST),
                          f'rank {p.rank}: async error {p.one("async_error")["status"]}')
            if timeouts:
                summary.append(f'rank {p.rank}: {len(timeouts)} ops timed out, '
                               f'{min(t(r, "end") for r in timeouts) - fault:.1f}..'
                               f'{max(t(r, "end") for r in timeouts) - fault:.1f} ms after the stop, '
                               f'{min(t(r, "end") - t(r, "post") for r in timeouts):.1f}..'
                               f'{max(t(r, "end") - t(r, "post") for r in timeouts):.1f} ms after their post')
        # Survivors leave while the peer is still stopped, then it resumes and leaves too.
        release_and_wait(survivors, 15000, 'after release, next to a stopped peer')
        for p in survivors:
            check_exit(p, checks, [OK, LOST], FINALIZE_NEXT_TO_STOPPED_MS, summary)
        os.kill(v.proc.pid, signal.SIGCONT)
        release_and_wait([v], STOP_TIMEOUT_MS + 15000, 'after SIGCONT')
        check_exit(v, checks, [OK, LOST, TIMEOUT], FINALIZE_MS, summary)
        check_no_wrong(job, checks)
        checks.raise_if_any()
        if VERBOSE:
            job.dump()
        return job
    except BaseException:
        job.dump()
        raise
    finally:
        job.kill_all()
        job.remove()


def scenario_abort(program, victim, summary):
    def args(r):
        a = ['--timeout-ms', str(OP_TIMEOUT_MS), '--later']
        return a + ['--abort-after', str(WARM_OPS)] if r == victim else a
    job = Job(program, args)
    try:
        job.start()
        v = job.peers[victim]
        others = [p for p in job.peers if p.rank != victim]
        job.wait_until(lambda: v.has('abort'), 60000, f'rank {victim} aborted')
        abort = v.one('abort')
        fault = t(abort, 't')
        job.wait_until(lambda: all(p.has('held') for p in job.peers), 15000, 'every peer reported its ops')
        checks = Checks()
        checks.expect(abort['status'] == OK, f'rank {victim}: taiji_peer_abort returned {abort["status"]}')
        woke = v.records('woke')
        checks.expect(sorted(r['kind'] for r in woke) == ['blocking', 'wait0', 'wait1'],
                      f'rank {victim}: waiters that woke: {woke}')
        for r in woke:
            checks.expect(r['status'] == ABORTED,
                          f'rank {victim}: waiter {r["kind"]} woke with {r["status"]}, expected {ABORTED}')
            late = t(r, 't') - fault
            checks.expect(0 <= late <= ABORT_WAKES_MS,
                          f'rank {victim}: waiter {r["kind"]} woke {late:.1f} ms after the abort')
        after = stream_after(v, checks, fault)
        for r in after:
            checks.expect(r['status'] in (OK, ABORTED, FINALIZED),
                          f'rank {victim}: op {r["i"]} after the abort ended with {r["status"]}')
            late = t(r, 'end') - fault
            checks.expect(late <= ABORT_WAKES_MS,
                          f'rank {victim}: op {r["i"]} ended {late:.1f} ms after the abort')
        checks.expect(v.one('stream-end')['failed'] in (ABORTED, FINALIZED),
                      f'rank {victim}: the stream ended with {v.one("stream-end")["failed"]}')
        for r in v.records('later'):
            checks.expect(r['status'] == FINALIZED,
                          f'rank {victim}: later {r["mode"]} op after the abort: {r["status"]}')
        checks.expect(len(v.records('later')) == 2, f'rank {victim}: later ops: {v.records("later")}')
        checks.expect(v.one('async_error')['status'] == ABORTED,
                      f'rank {victim}: async error {v.one("async_error")["status"]}, expected {ABORTED}')
        summary.append(f'rank {victim}: waiters woke '
                       + ', '.join(f'{r["kind"]} {t(r, "t") - fault:.1f} ms' for r in woke)
                       + f' after the abort; {len(after)} stream ops ended after it')
        for p in others:
            check_lost(p, checks, fault, victim, summary)
        release_and_wait(job.peers, 10000, 'after release')
        # taiji_peer_finalize reports OK after the peer's own abort.
        check_exit(v, checks, [OK], FINALIZE_MS, summary)
        for p in others:
            check_exit(p, checks, [LOST], FINALIZE_MS, summary)
        check_no_wrong(job, checks)
        checks.raise_if_any()
        if VERBOSE:
            job.dump()
        return job
    except BaseException:
        job.dump()
        raise
    finally:
        job.kill_all()
        job.remove()


def scenario_sigstop_ring3(program, victim, summary):
    """Three peers on a ring, one stopped: every survivor's timeout names the stopped rank,
    not the neighbour it waits on for data (which is itself waiting)."""
    scenario_sigstop(program, victim, summary, size=3, env={'TAIJI_TOPOLOGY': 'ring'}, blame=True)


SCENARIOS = {
    'kill9': scenario_kill9,
    'sigstop': scenario_sigstop,
    'sigstop-ring3': scenario_sigstop_ring3,
    'sigstop-large': scenario_sigstop_large,
    'abort': scenario_abort,
}


def main():
    if len(sys.argv) != 4 or sys.argv[2] not in SCENARIOS:
        print(__doc__.split('\n\n')[1], file=sys.stderr)
        return 2
    program, scenario, victim = sys.argv[1], sys.argv[2], int(sys.argv[3])
    summary = []
    start = now_ms()
    try:
        SCENARIOS[scenario](program, victim, summary)
    except Failed as e:
        for line in summary:
            print(line)
        print(f'FAILED: {scenario} rank {victim}:\n{e}')
        return 1
    for line in summary:
        print(line)
    print(f'ok: {scenario} rank {victim} ({(now_ms() - start) / 1000:.1f} s)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
