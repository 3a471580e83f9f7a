"""Session 31, start 3: the engine's batch-1 step (graphs recaptured, 100 ahead steps, as
``recaptured_step_ms``) per stack setting, alternated rounds, at 129-228 cached tokens (the
serial graph, as throughput.py's decode) and at 513-612 (the spread graph). Call 4 showed
the stack-alone replay is not a proxy at these sizes (kq -5 us alone, +12 us in the
engine's graph, stamped builds)."""
import json
import os
import statistics

import torch

from mmserve.bench.engine_run import prompted_decoder
from mmserve.kernels.triton_decode_stack import TUNING

SETTINGS = {"default": {}, "kt": {"k_t": True}, "qh": {"qkv_hoist": True},
            "kq": {"k_t": True, "qkv_hoist": True}, "h1": {"att_hoist": 1},
            "h2": {"att_hoist": 2}, "late": {"late_rstd": True}, "vl1": {"v_l1": True}}
if os.environ.get("SETTINGS"):  # NAME=JSON;NAME=JSON (s31f.sh)
    SETTINGS = {n: json.loads(j) for n, _, j in
                (x.partition("=") for x in os.environ["SETTINGS"].split(";"))}


@torch.inference_mode()
def main():
    dec, first, _ = prompted_decoder("smollm2-135m", 1024)
    base = dict(TUNING)
    rows = []
    for rnd in range(3):
        order = list(SETTINGS.items())  # odd rounds in reverse (no setting always first)
        for name, over in (order if rnd % 2 == 0 else order[::-1]):
            TUNING.clear()
            TUNING.update({**base, **over})
            ms, row0 = dec.recaptured_step_ms(first)
            long = dec.decode(first, 512, 100, graphs=True, ahead=True)
            r = dict(setting=name, round=rnd, short_us=ms * 1e3,
                     long_us=long.seconds / long.steps * 1e6, row0=row0[:6], long0=long.row0[:6])
            rows.append(r)
            print(json.dumps(r), flush=True)
    TUNING.clear()
    TUNING.update(base)
    print("summary: engine step us (median of 3 rounds; each round's), 129-228 | 513-612")
    for name in SETTINGS:
        rr = [r for r in rows if r["setting"] == name]
        s = [round(r["short_us"], 1) for r in rr]
        g = [round(r["long_us"], 1) for r in rr]
        print(f"  {name:8s} {statistics.median(s):6.1f} {s}  {statistics.median(g):6.1f} {g}")
    with open(os.path.join(os.environ.get("OUT", "."), "engine_settings.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
