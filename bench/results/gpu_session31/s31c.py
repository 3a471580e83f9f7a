"""Session 31, start 2: why the engine's batch-1 step did not move when the stack's replay
did (call 2: kq replay -16 us at 200 cached tokens, the ahead loop 581 us both).
Alternated rounds per setting: the ahead loop's step (recaptured_step_ms), the engine's
whole serial graph replayed alone (events, idle GPU before each), the stack's graph alone
at 200 cached tokens, and the ahead loop's host split (inside run_verify / waiting)."""
import importlib.util
import json
import os
import statistics
import sys
import time

import torch

from mmserve.bench.engine_run import prompted_decoder
from mmserve.bench.limits import cuda_time_ms
from mmserve.kernels.decode_stack import stacked_weights
from mmserve.kernels.triton_copy import copy_flat
from mmserve.kernels.triton_decode_stack import TUNING, default_programs

spec = importlib.util.spec_from_file_location("sp", "bench/stack_profile.py")
sp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sp)
BS = 16


def host_split(dec, first, steps=100):
    b = 1
    host = torch.empty(b, dtype=torch.long, pin_memory=True)
    ready = torch.cuda.Event()
    tables, pos = dec.tables[:b], [128]
    step = dec.graphs.run_verify([[t] for t in first], pos, tables, BS)
    launch, wait, total = [], [], []
    t0 = time.perf_counter()
    for i in range(steps):
        picked = step.argmax[:b]
        copy_flat(host, picked)
        ready.record()
        pos = [p + 1 for p in pos]
        ta = time.perf_counter()
        step = dec.graphs.run_verify([[0]] * b, pos, tables, BS, input_ids=picked)
        tb = time.perf_counter()
        ready.synchronize()
        t1 = time.perf_counter()
        launch.append(tb - ta)
        wait.append(t1 - tb)
        total.append(t1 - t0)
        t0 = t1
    torch.cuda.synchronize()
    m = lambda v: statistics.median(v[10:]) * 1e6  # noqa: E731
    return m(launch), m(wait), m(total)


def graph_alone(dec):
    key = (1, 1)
    g = dec.graphs.serial.get(key)
    graph = g[0] if g is not None else dec.graphs.graphs[key]
    return cuda_time_ms(graph.replay, repeats=200) * 1e3


@torch.inference_mode()
def main():
    dec, first, _ = prompted_decoder("smollm2-135m", 1024)
    model = dec.model
    programs = default_programs(stacked_weights(model.layers), model.num_kv_heads, dec.device)
    base = dict(TUNING)
    settings = {"default": {}, "kq": {"k_t": True, "qkv_hoist": True},
                "kqh2": {"k_t": True, "qkv_hoist": True, "att_hoist": 2}}
    rows = []
    for rnd in range(3):
        for name, over in settings.items():
            TUNING.clear()
            TUNING.update({**base, **over})
            ms, row0 = dec.recaptured_step_ms(first)
            launch, wait, total = host_split(dec, first)
            alone = graph_alone(dec)
            stack = sp.profile_row(model, dec, 200, programs)["stack_graph_us"]
            r = dict(setting=name, round=rnd, ahead_step_us=ms * 1e3, graph_alone_us=alone,
                     stack_200_us=stack, host_launch_us=launch, host_wait_us=wait,
                     split_total_us=total, row0=row0[:8])
            rows.append(r)
            print(json.dumps(r), flush=True)
    TUNING.clear()
    TUNING.update(base)
    print("summary (median over rounds, us): ahead step | engine graph alone | stack alone "
          "(200) | host launch | host wait")
    for name in settings:
        rr = [r for r in rows if r["setting"] == name]
        med = lambda k: statistics.median(r[k] for r in rr)  # noqa: E731
        print(f"  {name:8s} {med('ahead_step_us'):7.1f} {med('graph_alone_us'):7.1f} "
              f"{med('stack_200_us'):7.1f} {med('host_launch_us'):6.1f} {med('host_wait_us'):6.1f}")
    with open(os.path.join(os.environ.get("OUT", "."), "engine_ab.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
