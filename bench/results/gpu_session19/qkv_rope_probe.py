"""Session 19 probe: the 8B batch-1 step with rope in the QKV epilogue (default) against
the product + rope_write_kv, both as the sync decode (host reads each step) and the
ahead decode (steps launched from the device argmax), ABBA-ordered pairs."""
import json
import statistics
import sys

from mmserve.bench.engine_run import batch1_step_baseline
from mmserve.kernels import fused

out, pairs = sys.argv[1], int(sys.argv[2])
dec, first, report = batch1_step_baseline("llama3-8b")


def measure(on):
    fused.set_qkv_rope(on)
    dec.capture((1,))
    s = dec.decode(first, 128, 100, graphs=True)
    a = dec.decode(first, 128, 100, graphs=True, ahead=True)
    assert a.row0 == s.row0
    return s.step_ms_p50, a.seconds / a.steps * 1e3, s.row0


rows = []
ref = None
for p in range(pairs):
    order = (True, False) if p % 2 == 0 else (False, True)
    got = {}
    for on in order:
        got[on] = measure(on)
        ref = ref or got[on][2]
        assert got[on][2] == ref
    r = {"sync_on": got[True][0], "sync_off": got[False][0], "ahead_on": got[True][1],
         "ahead_off": got[False][1]}
    rows.append(r)
    print({k: round(v * 1e3, 1) for k, v in r.items()}, flush=True)
fused.set_qkv_rope(True)
summary = {k: statistics.median(r[k] for r in rows) * 1e3 for k in rows[0]}
print("median us:", {k: round(v, 1) for k, v in summary.items()},
      "sync off/on", round(summary["sync_off"] / summary["sync_on"], 4),
      "ahead off/on", round(summary["ahead_off"] / summary["ahead_on"], 4))
report.update(pairs=rows, median_us=summary)
json.dump(report, open(out, "w"), indent=1)
