"""bench spec on CPU with the default model, cut down to one short row: the report's
fields, identical outputs, the speed-up as the median of the pairs' ratios, and the
speculator's host time per step."""

from __future__ import annotations

import json
import statistics

from mmserve.bench import spec as spec_bench


def _covers(n: int, k: int) -> float:
    """P(k-th smallest <= median <= k-th largest) of n draws, by enumerating which draws
    fall below the median (each with probability 1/2): at least k below and k above."""
    hits = sum(1 for mask in range(2**n) if k <= bin(mask).count("1") <= n - k)
    return hits / 2**n


def test_median_interval_is_the_widest_k_with_the_coverage():
    for n in range(1, 16):
        values = [float(v) for v in range(n, 0, -1)]  # given unsorted
        lo, hi, coverage = spec_bench.median_interval(values, 0.9)
        k = int(lo)  # the k-th smallest of 1..n is k
        assert hi == n + 1 - k and coverage == _covers(n, k)
        if k > 1 or _covers(n, 1) >= 0.9:
            assert coverage >= 0.9
        else:  # too few values: (min, max), whatever they cover
            assert (lo, hi) == (1, n)
        if 2 * (k + 1) <= n + 1:
            assert _covers(n, k + 1) < 0.9, "a narrower interval would do"
    assert spec_bench.median_interval(
        [0.95, 1.0, 0.99, 0.93, 1.01, 0.98, 0.97, 0.96, 1.02, 0.94, 0.99]
    )[:2] == (0.95, 1.0)  # 11 pairs: 3rd, 9th


def test_floor_verdict_needs_the_whole_interval_and_the_coverage():
    verdict = spec_bench.floor_verdict
    assert verdict(*spec_bench.median_interval([0.98, 1.0, 0.99, 1.2, 0.975])) == "met"
    assert verdict(*spec_bench.median_interval([0.9, 0.95, 0.96, 0.93, 0.969])) == "below"
    assert verdict(*spec_bench.median_interval([0.9, 0.99, 0.96, 1.0, 0.98])) == "unclear"
    assert verdict(*spec_bench.median_interval([0.98, 1.0, 0.99, 1.2])) == "unclear"  # 87.5 %
    assert verdict(0.97, 0.99, 0.93) == "met" and verdict(0.95, 0.97, 0.93) == "unclear"


def test_one_row_report(default_model_dir, tmp_path, monkeypatch):
    times = []
    real = spec_bench._timed

    def timed(llm, convs, params, speculate=None):
        out = real(llm, convs, params, speculate)
        times.append((speculate, out[0]))
        return out

    monkeypatch.setattr(spec_bench, "_timed", timed)
    report = spec_bench.run_spec_bench(
        str(default_model_dir),
        workloads=("edit",),
        concurrencies=(1,),
        max_tokens=12,
        repeats=3,
        out_dir=tmp_path,
        min_requests=1,
    )
    (row,) = report["rows"]
    assert row["identical"] and row["requests"] == 1 and row["tokens"] > 0
    timed_runs = times[-6:]  # the three interleaved pairs: off/on, on/off, off/on
    assert [on for on, _ in timed_runs] == [False, True, True, False, False, True]
    plain = [t for on, t in timed_runs if not on]
    spec = [t for on, t in timed_runs if on]
    assert row["plain_seconds"] == plain and row["spec_seconds"] == spec
    assert row["speedup"] == statistics.median(p / s for p, s in zip(plain, spec, strict=True))
    assert row["speedup_of_bests"] == min(plain) / min(spec)
    ratios = sorted(p / s for p, s in zip(plain, spec, strict=True))
    assert row["speedup_interval"] == [ratios[0], ratios[-1]]  # 3 pairs: min and max
    assert row["speedup_interval_coverage"] == 0.75
    assert row["floor_0_97"] == "unclear"  # 3 pairs cover 75 %: too few for a verdict
    assert row["plain_tok_s"] == row["tokens"] / min(plain)
    assert row["spec_host_us_per_step"] > 0
    assert json.loads((tmp_path / "spec.json").read_text())["rows"] == [row]
