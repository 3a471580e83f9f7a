"""bench spec on CPU with the default model, cut down to one short row: the report's
fields, identical outputs, the speed-up as the median of the pairs' ratios, and the
speculator's host time per step."""

from __future__ import annotations

import json
import statistics

from mmserve.bench import spec as spec_bench


def test_one_row_report(default_model_dir, tmp_path, monkeypatch):
    times = []
    real = spec_bench._timed

    def timed(llm, convs, params, speculate=None):
        out = real(llm, convs, params, speculate)
        times.append((speculate, out[0]))
        return out

    monkeypatch.setattr(spec_bench, "_timed", timed)
    report = spec_bench.run_spec_bench(
        str(default_model_dir), workloads=("edit",), concurrencies=(1,), max_tokens=12,
        repeats=3, out_dir=tmp_path, min_requests=1)
    (row,) = report["rows"]
    assert row["identical"] and row["requests"] == 1 and row["tokens"] > 0
    timed_runs = times[-6:]  # the three interleaved pairs: off/on, on/off, off/on
    assert [on for on, _ in timed_runs] == [False, True, True, False, False, True]
    plain = [t for on, t in timed_runs if not on]
    spec = [t for on, t in timed_runs if on]
    assert row["speedup"] == statistics.median(p / s for p, s in zip(plain, spec, strict=True))
    assert row["speedup_of_bests"] == min(plain) / min(spec)
    assert row["plain_tok_s"] == row["tokens"] / min(plain)
    assert row["spec_host_us_per_step"] > 0
    assert json.loads((tmp_path / "spec.json").read_text())["rows"] == [row]
