#!/usr/bin/python3
"""busbw against message size for taiji and its peers, one panel per bandwidth case.

Usage: plot.py RESULTS.jsonl OUT_PREFIX   writes OUT_PREFIX.png (matplotlib) or, without
matplotlib, OUT_PREFIX.svg drawn by hand. Rows as bench/compare/run.sh writes them, chosen
as in its table (results.py): the median round, the best algorithm.
"""
import json
import math
import sys

import results

COLORS = {"taiji": "#d62728", "gloo": "#1f77b4", "mpi": "#2ca02c", "torch": "#ff7f0e"}


def series(path):
    """{panel title: {impl: [(size, busbw)]}} for the bandwidth rows (above 4 KiB)."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    panels = {}
    for (case, op, n, size, impl), r in sorted(results.best_rows(rows).items()):
        if op != "barrier" and size > 4096:
            panels.setdefault(f"{case}: {op}, n={n}", {}).setdefault(impl, []).append(
                (size, r["busbw_gbps"]))
    return panels


def size_label(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift:
            return f"{b / (1 << shift):g}{unit}"
    return str(b)


def plot_png(panels, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (title, impls) in zip(axes[0], panels.items()):
        for impl, pts in impls.items():
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", label=impl, color=COLORS.get(impl))
        ax.set_xscale("log", base=2)
        ax.set_title(title)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ticks = sorted({x for pts in impls.values() for x, _ in pts})
        ax.set_xticks(ticks, [size_label(t) for t in ticks])
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=110)
    return out + ".png"


def plot_svg(panels, out):
    w, h, pad = 360, 260, 45
    parts = []
    for k, (title, impls) in enumerate(panels.items()):
        x0 = k * (w + 20)
        pts = [p for v in impls.values() for p in v]
        lx = [math.log2(s) for s, _ in pts]
        xmin, xmax = min(lx), max(lx) if max(lx) > min(lx) else min(lx) + 1
        ymax = max(b for _, b in pts) * 1.1 or 1
        sx = lambda s: x0 + pad + (math.log2(s) - xmin) / (xmax - xmin) * (w - 2 * pad)  # noqa: E731
        sy = lambda b: h - pad - b / ymax * (h - 2 * pad)  # noqa: E731
        parts.append(f'<text x="{x0 + w / 2}" y="16" text-anchor="middle">{title}</text>')
        parts.append(f'<rect x="{x0 + pad}" y="{pad}" width="{w - 2 * pad}" height="{h - 2 * pad}" '
                     'fill="none" stroke="#888"/>')
        parts.append(f'<text x="{x0 + 4}" y="{pad - 6}" font-size="10">{ymax:.3g} GB/s</text>')
        for s in sorted({s for s, _ in pts}):
            parts.append(f'<text x="{sx(s):.1f}" y="{h - pad + 14}" font-size="10" '
                         f'text-anchor="middle">{size_label(s)}</text>')
        for j, (impl, series_pts) in enumerate(impls.items()):
            c = COLORS.get(impl, "#000")
            path = " ".join(f"{sx(s):.1f},{sy(b):.1f}" for s, b in series_pts)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
            parts.append(f'<text x="{x0 + pad + 6}" y="{pad + 14 + 13 * j}" font-size="11" '
                         f'fill="{c}">{impl}</text>')
    width = len(panels) * (w + 20)
    with open(out + ".svg", "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" '
                f'font-family="sans-serif" font-size="12">\n' + "\n".join(parts) + "\n</svg>\n")
    return out + ".svg"


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    panels = series(sys.argv[1])
    if not panels:
        print("plot.py: no bandwidth rows to plot", file=sys.stderr)
        return 0
    try:
        import matplotlib  # noqa: F401
        path = plot_png(panels, sys.argv[2])
    except ImportError:
        path = plot_svg(panels, sys.argv[2])
    print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
