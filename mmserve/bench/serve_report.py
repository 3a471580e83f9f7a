"""``mmserve bench serve``'s figures: one load's timings summarised, a table, a PNG.

A load's tok/s is the tokens of its completed requests over the span from its first
request's start to its last one's end; TTFT and gap percentiles are over its requests
and over every gap between text arrivals of every request (linear interpolation).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mmserve.bench.serve_clients import ShareResult, Timing


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 3)


def summarize(timings: list[Timing], clients: int, shares: list[ShareResult] | None = None) -> dict:
    """One load's figures (JSON-able)."""
    ok = [t for t in timings if t.error is None]
    errors = [t.error for t in timings if t.error is not None]
    span = (max(t.end for t in timings) - min(t.start for t in timings)) if timings else 0.0
    tokens = sum(t.tokens for t in ok)
    ttfts = [t.ttft for t in ok if t.ttft is not None]
    gaps = [g for t in ok for g in t.gaps]
    out = {
        "clients": clients,
        "requests": len(timings),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "tokens": tokens,
        "seconds": round(span, 4),
        "tok_s": round(tokens / span, 1) if span > 0 else None,
        "ttft_p50_ms": _ms(percentile(ttfts, 50)),
        "ttft_p99_ms": _ms(percentile(ttfts, 99)),
        "ttft_max_ms": _ms(max(ttfts, default=None)),
        "gap_p50_ms": _ms(percentile(gaps, 50)),
        "gap_p99_ms": _ms(percentile(gaps, 99)),
        "text_events_per_request": round(sum(len(t.gaps) + 1 for t in ok) / len(ok), 2)
        if ok
        else None,
    }
    if shares:  # a client process near 1.0 may have held the load back itself
        out["client_procs"] = len(shares)
        out["client_cpu_util_max"] = round(max(s.cpu_s / s.wall_s for s in shares if s.wall_s), 3)
    return out


def ratios(result: dict) -> None:
    """Served tok/s as a fraction of the engine in-process at each load (in place)."""
    engine = result.get("engine", {})
    for kind in ("sse", "ws"):
        for c, level in result.get(kind, {}).items():
            base = engine.get(c, {}).get("tok_s")
            if base and level.get("tok_s"):
                level["vs_engine"] = round(level["tok_s"] / base, 3)
    first, steady = result.get("first_burst"), result.get("steady_burst")
    if first and steady:
        result["first_vs_steady"] = {
            k: round(first[k] / steady[k], 2) if first.get(k) and steady.get(k) else None
            for k in ("ttft_p50_ms", "ttft_p99_ms")
        }


def _cell(level: dict | None, key: str, fmt: str) -> str:
    value = None if level is None else level.get(key)
    return "-" if value is None else fmt.format(value)


def _busiest(level: dict) -> str:
    from mmserve.bench.proc_cpu import busiest_thread

    best = busiest_thread(level.get("server_cpu") or {})
    return "" if best is None else f"{best[0]} {best[1]:.2f}"


def table(result: dict) -> str:
    """A short text table: one line per (path, load)."""
    lines = [
        f"mmserve bench serve: {result['model']} on {result['machine']['device']}, "
        f"{result['config']['max_tokens']} tokens a request, server start-up "
        f"{result['server']['startup_s']:.1f}s",
        f"{'path':<8}{'clients':>8}{'tok/s':>10}{'x engine':>9}{'TTFT p50':>10}"
        f"{'p99 ms':>9}{'gap p99':>9}{'errors':>7}  busiest server thread (CPU share)",
    ]
    for kind in ("engine", "sse", "ws"):
        for c, lv in result.get(kind, {}).items():
            lines.append(
                f"{kind:<8}{c:>8}{_cell(lv, 'tok_s', '{:,.0f}'):>10}"
                f"{_cell(lv, 'vs_engine', '{:.2f}'):>9}"
                f"{_cell(lv, 'ttft_p50_ms', '{:.1f}'):>10}"
                f"{_cell(lv, 'ttft_p99_ms', '{:.1f}'):>9}"
                f"{_cell(lv, 'gap_p99_ms', '{:.1f}'):>9}{lv['errors']:>7}  {_busiest(lv)}"
            )
    for name in ("first_burst", "steady_burst"):
        lv = result.get(name)
        if lv:
            lines.append(
                f"{name:<14} {lv['clients']} requests at once: TTFT p50 "
                f"{_cell(lv, 'ttft_p50_ms', '{:.1f}')} ms, p99 "
                f"{_cell(lv, 'ttft_p99_ms', '{:.1f}')} ms"
            )
    if result.get("first_vs_steady"):
        r = result["first_vs_steady"]
        lines.append(f"first/steady TTFT: p50 {r['ttft_p50_ms']}x, p99 {r['ttft_p99_ms']}x")
    return "\n".join(lines)


PANELS = (
    ("tok_s", "tok/s (aggregate)", "linear"),
    ("ttft_p99_ms", "TTFT p99 (ms)", "log"),
    ("gap_p99_ms", "inter-token gap p99 (ms)", "log"),
)


def plot(result: dict, path: Path) -> str:
    """tok/s, TTFT p99 and gap p99 against clients, one line per path; returns a note."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot"
    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4.2))
    clients: set[int] = set()
    for kind, label in (
        ("engine", "engine in-process"),
        ("sse", "served, SDK SSE"),
        ("ws", "served, Realtime WS"),
    ):
        levels = result.get(kind, {})
        cs = sorted(levels, key=int)
        clients.update(int(c) for c in cs)
        for ax, (key, _, _) in zip(axes, PANELS, strict=True):
            points = [(int(c), levels[c].get(key)) for c in cs if levels[c].get(key)]
            if points:
                ax.plot(*zip(*points, strict=True), "o-", label=label)
    for ax, (_, ylabel, yscale) in zip(axes, PANELS, strict=True):
        ax.set(xscale="log", yscale=yscale, xlabel="concurrent clients", ylabel=ylabel)
        ax.set_xticks(sorted(clients), [str(c) for c in sorted(clients)])
        ax.tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
        ax.legend(fontsize=8)
    axes[0].set_title(f"{result['model']} ({result['machine']['device']})")
    axes[1].set_title(f"{result['config']['max_tokens']} tokens a request")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def main(argv: list[str]) -> int:
    """``python -m mmserve.bench.serve_report serve.json``: the table, and the PNG beside
    the JSON (for a run on a machine without matplotlib)."""
    if len(argv) != 1:
        print("usage: python -m mmserve.bench.serve_report SERVE_JSON", file=sys.stderr)
        return 2
    path = Path(argv[0])
    result = json.loads(path.read_text())
    print(table(result))
    print(plot(result, path.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
