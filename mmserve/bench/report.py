"""The throughput result as a short text table and a PNG (when matplotlib is installed).

Rows and lines follow the variants in the result, whatever they are; the row-0 line says
whether the exact-cache variants gave the same tokens, and how far a lossy (fp8) KV cache's
tokens agree with the reference variant's.
"""

from __future__ import annotations

from pathlib import Path


def _cell(d: dict | None, key: str = "tok_s", fmt: str = "{:,.0f}") -> str:
    return fmt.format(d[key]) if d and key in d else "-"


def table(result: dict) -> str:
    bw = max(result["bandwidth"]["gb_s"])
    lines = [
        f"{result['machine']['gpu']}  copy bandwidth {bw:,.0f} GB/s  weights: {result['weights']}"
    ]
    head = "model          variant             b1 tok/s  %roof  {}  TTFT ms  prefill tok/s"
    for name, m in result["models"].items():
        sizes = sorted(
            {b for v in m["engine"].values() for b in v["decode"]}
            | set(m.get("hf", {}).get("eager", {})),
            key=int,
        )
        lines.append(head.format("  ".join(f"b{b:>4} tok/s" for b in sizes if b != "1")))
        rows = [(k, v["decode"], v.get("prefill")) for k, v in m["engine"].items()]
        if "hf" in m:
            rows.append(("hf_eager", m["hf"]["eager"], m["hf"].get("prefill")))
        for label, dec, pre in rows:
            b1 = dec.get("1")
            roof = f"{100 * b1['tok_s'] / m['roofline_tok_s']:5.1f}" if b1 else "    -"
            rest = "  ".join(f"{_cell(dec.get(b)):>11}" for b in sizes if b != "1")
            lines.append(
                f"{name:<14} {label:<18} {_cell(b1):>9}  {roof}  {rest}  "
                f"{_cell(pre, 'ttft_ms', '{:,.1f}'):>7}  "
                f"{_cell(pre, 'prefill_tok_s'):>13}"
            )
        first: dict = next(iter(m["engine"].values()), {})
        eager = first.get("eager_b1")
        if eager:
            lines.append(f"{name:<14} {'eager (no graphs)':<18} {_cell(eager):>9}")
        row0 = _row0_line(m)
        if row0:
            lines.append(f"{name:<14} row 0 tokens: {row0}")
        lines.append(
            f"{name:<14} roofline b1 {m['roofline_tok_s']:,.0f} tok/s "
            f"({m['weight_bytes'] / 1e9:.2f} GB of weights)"
        )
    return "\n".join(lines)


def _row0_line(m: dict) -> str:
    """Row 0's tokens across variants: equality (exact caches), agreement (lossy caches)."""
    parts = []
    equal = m.get("row0_tokens_equal_across_variants", {})
    if len(equal) > 1:
        same = all(equal.values())
        parts.append(f"{'equal' if same else 'NOT equal'} across {', '.join(equal)}")
    for v, a in m.get("row0_lossy_kv_agreement", {}).items():
        first = a["first_mismatch"]
        where = "none differ" if first is None else f"first differs at step {first}"
        parts.append(
            f"{v} vs {a['reference']} {100 * a['equal_fraction']:.0f}% equal "
            f"({where}; lossy, not required equal)"
        )
    return "; ".join(parts)


def plot(result: dict, path: Path) -> str:
    """Decode tok/s against batch size, log-log, one line per variant; returns a note."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot"
    models = result["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, (name, m) in zip(axes[0], models.items(), strict=True):
        series = {k: v["decode"] for k, v in m["engine"].items()}
        if "hf" in m:
            series["hf_eager"] = m["hf"]["eager"]
        for label, dec in series.items():
            bs = sorted(dec, key=int)
            ax.plot([int(b) for b in bs], [dec[b]["tok_s"] for b in bs], "o-", label=label)
        ax.axhline(m["roofline_tok_s"], ls="--", c="gray", label="b1 roofline")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="batch size",
            ylabel="decode tok/s (aggregate)",
            title=f"{name} ({result['machine']['gpu']}, random weights)",
        )
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
