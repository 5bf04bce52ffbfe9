#!/usr/bin/env python3
"""Scrapes a taiji peer's Prometheus endpoint with urllib and checks the exposition text.

usage: scrape.py URL RANK ALLREDUCES BROADCASTS
Exits 0 when the text follows the format (HELP and TYPE before each family's samples,
label syntax, cumulative histogram buckets ending at +Inf equal to _count) and the counts
equal the ops the peer ran: ALLREDUCES under name "grad/w", BROADCASTS under 'weights "b"'.
"""
import re
import sys
import urllib.error
import urllib.request

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def fail(msg):
    print("scrape: " + msg)
    sys.exit(1)


def parse_labels(text):
    labels, pos = {}, 0
    while pos < len(text):
        m = LABEL.match(text, pos)
        if not m:
            fail("bad labels: " + text)
        value = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        labels[m.group(1)] = value
        pos = m.end()
    return labels


def parse(text):
    families, samples, current = {}, [], None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            current = line.split(" ")[2]
            if current in families:
                fail("family repeated: " + current)
            families[current] = None
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            if name != current:
                fail("TYPE without HELP: " + name)
            families[name] = kind
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            if not m:
                fail("bad sample line: " + line)
            name = m.group(1)
            base = re.sub(r"_(bucket|sum|count)$", "", name) if families.get(current) == "histogram" else name
            if base != current:
                fail("sample outside its family: " + line)
            samples.append((name, parse_labels(m.group(3) or ""), float(m.group(4))))
    return families, samples


def value(samples, metric, **labels):
    found = [v for n, l, v in samples if n == metric and all(l.get(k) == w for k, w in labels.items())]
    if len(found) != 1:
        fail("%s%s: %d samples" % (metric, labels, len(found)))
    return found[0]


def check_histogram(samples, family, **labels):
    name = family
    buckets = [(l["le"], v) for n, l, v in samples
               if n == name + "_bucket" and all(l.get(k) == w for k, w in labels.items())]
    if not buckets or buckets[-1][0] != "+Inf":
        fail(name + ": no +Inf bucket")
    counts = [v for _, v in buckets]
    bounds = [float(le) for le, _ in buckets]
    if counts != sorted(counts) or bounds != sorted(bounds):
        fail(name + ": buckets not cumulative")
    count = value(samples, name + "_count", **labels)
    if counts[-1] != count:
        fail(name + ": +Inf bucket %g != count %g" % (counts[-1], count))
    if count > 0 and value(samples, name + "_sum", **labels) <= 0:
        fail(name + ": empty sum")
    return count


def main():
    url, rank, allreduces, broadcasts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with urllib.request.urlopen(url, timeout=20) as r:
        if r.status != 200:
            fail("status %d" % r.status)
        ctype = r.headers.get("Content-Type", "")
        if not ctype.startswith("text/plain; version=0.0.4"):
            fail("content type " + ctype)
        text = r.read().decode("utf-8")
    families, samples = parse(text)
    for name, kind in families.items():
        if kind not in ("counter", "gauge", "histogram"):
            fail("family %s has type %s" % (name, kind))
        if kind == "counter" and not name.endswith("_total"):
            fail("counter without _total: " + name)
        if not name.startswith("taiji_"):
            fail("name without prefix: " + name)
    for _, labels, _ in samples:
        if labels.get("rank") != rank:
            fail("sample without rank=%s: %s" % (rank, labels))
    if value(samples, "taiji_ops_total", kind="allreduce") != allreduces:
        fail("allreduce count")
    if value(samples, "taiji_ops_total", kind="broadcast") != broadcasts:
        fail("broadcast count")
    if value(samples, "taiji_op_bytes_total", kind="allreduce") != allreduces * 64:
        fail("allreduce bytes")
    if check_histogram(samples, "taiji_op_duration_seconds", kind="allreduce") != allreduces:
        fail("allreduce histogram count")
    if check_histogram(samples, "taiji_named_op_duration_seconds", name="grad/w") != allreduces:
        fail("named histogram count")
    if value(samples, "taiji_named_ops_total", name='weights "b"') != broadcasts:
        fail("escaped name count")
    peer = "1" if rank == "0" else "0"
    if value(samples, "taiji_link_sent_bytes_total", peer=peer) <= 0:
        fail("no bytes sent")
    for path, code in (("/nothing", 404),):
        try:
            urllib.request.urlopen(url.replace("/metrics", path), timeout=20)
            fail(path + " answered")
        except urllib.error.HTTPError as e:
            if e.code != code:
                fail("%s: %d" % (path, e.code))
    req = urllib.request.Request(url, data=b"x", method="POST")
    try:
        urllib.request.urlopen(req, timeout=20)
        fail("POST answered")
    except urllib.error.HTTPError as e:
        if e.code != 405:
            fail("POST: %d" % e.code)
    print("scrape: ok, %d families, %d samples" % (len(families), len(samples)))


if __name__ == "__main__":
    main()
