"""``mmserve bench voice``'s report: a short table, and a PNG when matplotlib is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def table(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"{m['gpu'] or m['cpu']}  torch {m['torch']}  {result['seconds']} s of audio a "
        f"stream, {result['buffer_ms']:.0f} ms client buffer, arrivals over "
        f"{result['ramp_s']} s",
        "voice           mode      streams text  served refused  ttfa p50   p95    max  "
        "no-underrun  worst gap p95   max  rtf p50  text ttft/itl ms",
    ]
    for name, v in result["voices"].items():
        if "skipped" in v:
            lines.append(f"{name:<15} skipped: {v['skipped']}")
        for r in v.get("loads", []):
            t, g = r["ttfa_ms"], r["worst_gap_ms"]
            share = r["no_underrun_share"]
            text = r.get("text")
            tx = f"{_ms(text['ttft_ms_p50'])}/{_ms(text['itl_ms_p50'])}" if text else ""
            rtf = r["rtf"]["p50"]
            lines.append(
                f"{name:<15} {r['mode']:<9} {r['streams']:>7} {r['text_clients']:>4} "
                f"{r['served']:>7} {r['refused']:>7} {_ms(t['p50']):>9} {_ms(t['p95']):>5} "
                f"{_ms(t['max']):>6}  {'-' if share is None else f'{100 * share:.0f} %':>11}  "
                f"{_ms(g['p95']):>13} {_ms(g['max']):>5}  "
                f"{'-' if rtf is None else f'{rtf:.3f}':>7}  {tx}"
            )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> bool:
    """First-audio latency, underruns and refusals against stream count (voice-only loads)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (
        ("time to first audio p50 (ms)", lambda r: r["ttfa_ms"]["p50"]),
        (
            "streams with an underrun (%)",
            lambda r: (
                None if r["no_underrun_share"] is None else 100 * (1 - r["no_underrun_share"])
            ),
        ),
        ("worst playback gap p95 (ms)", lambda r: r["worst_gap_ms"]["p95"]),
    )
    for ax, (title, get) in zip(axes, panels, strict=True):
        for name, v in result["voices"].items():
            for mode, style in (("deadline", "-o"), ("fifo", "--s")):
                rows = [
                    r for r in v.get("loads", []) if r["mode"] == mode and not r["text_clients"]
                ]
                pts = [(r["streams"], get(r)) for r in rows if get(r) is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), style, label=f"{name} {mode}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    m = result["machine"]
    fig.suptitle(
        f"mmserve bench voice - {m['gpu'] or m['cpu']}, {result['buffer_ms']:.0f} ms client buffer"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":  # the PNG from a voice.json made where matplotlib was missing
    import json
    import sys

    src = Path(sys.argv[1])
    data = json.loads(src.read_text())
    print(table(data))
    print("wrote", src.with_suffix(".png")) if plot(data, src.with_suffix(".png")) else print(
        "matplotlib is not installed"
    )
