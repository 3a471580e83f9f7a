"""Session 31, start 3: the stack's phase stamps inside the engine's batch-1 graph against
the stack's graph alone (call 3: kq -14 us alone, -2 to -4 us in the engine's step).
Every launch of the stack stamps into one buffer (decode_stack's ``timing``), so after
``recaptured_step_ms`` (100 ahead steps from 128 cached tokens) it holds the last
engine step's stamps; then ``stack_profile.profile_row`` at that step's context."""
import importlib.util
import json
import os
import statistics

import torch

from mmserve.bench.engine_run import prompted_decoder
from mmserve.kernels import triton_decode_stack as tds
from mmserve.kernels.decode_stack import stacked_weights
from mmserve.kernels.triton_decode_stack import TUNING, default_programs

spec = importlib.util.spec_from_file_location("sp", "bench/stack_profile.py")
sp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sp)
PH = sp.PHASES


def brief(tab):
    return {"stamped_us": round(tab["stamped_us"], 1), "layer_us": round(tab["layer_us"], 2),
            **{p: (round(tab[p]["critical_us"], 2), round(tab[p]["barrier_us"], 2)) for p in PH}}


@torch.inference_mode()
def main():
    dec, first, _ = prompted_decoder("smollm2-135m", 1024)
    model = dec.model
    L = model.num_layers
    programs = default_programs(stacked_weights(model.layers), model.num_kv_heads, dec.device)
    T = torch.zeros(programs, 4 + 10 * L, dtype=torch.int64, device=dec.device)
    plain = tds.decode_stack

    def stamped(*a, **k):
        if k.get("timing") is None:
            k["timing"] = T
        return plain(*a, **k)

    base = dict(TUNING)
    settings = {"default": {}, "kq": {"k_t": True, "qkv_hoist": True}}
    rows = []
    for rnd in range(2):
        for name, over in settings.items():
            TUNING.clear()
            TUNING.update({**base, **over})
            tds.decode_stack = stamped
            try:
                ms, _ = dec.recaptured_step_ms(first)
                torch.cuda.synchronize()
                eng = brief(sp.phase_table(T.cpu(), L))
            finally:
                tds.decode_stack = plain
            alone = sp.profile_row(model, dec, 231, programs)
            alone_b = brief(alone)
            r = dict(setting=name, round=rnd, step_us=ms * 1e3, engine=eng, alone=alone_b,
                     alone_graph_us=alone["stack_graph_us"])
            rows.append(r)
            print(json.dumps(r), flush=True)
    TUNING.clear()
    TUNING.update(base)
    print("summary, median over rounds (us): step (stamped) | stack stamped in the engine | "
          "alone stamped | alone graph; then per phase critical+barrier, engine / alone")
    for name in settings:
        rr = [r for r in rows if r["setting"] == name]
        med = lambda f: statistics.median(f(r) for r in rr)  # noqa: E731
        print(f"  {name:8s} {med(lambda r: r['step_us']):7.1f} "
              f"{med(lambda r: r['engine']['stamped_us']):7.1f} "
              f"{med(lambda r: r['alone']['stamped_us']):7.1f} {med(lambda r: r['alone_graph_us']):7.1f}")
        print("    " + "  ".join(
            f"{p} {med(lambda r: sum(r['engine'][p])):.2f}/{med(lambda r: sum(r['alone'][p])):.2f}"
            for p in PH))
    with open(os.path.join(os.environ.get("OUT", "."), "engine_stamps.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
