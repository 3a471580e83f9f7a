"""Decode and verify steps of up to 16 rows: the one-launch stack against the layered path.

Random-weight model (SmolLM2-135M shape by default), 16 sequences with ``--prompt``
cached tokens each (128 by default), the engine's CUDA graphs (``DecodeGraphs``: batch
sizes 1, 2, 4, 8, 16, query sizes 1, 2, 3, 5, 9, as an engine with ``k_max`` 8 captures
them). For each setting
(the layered kernels for every step; the stack for steps of <= 16 rows, a tile's 128-key
splits spread over programs of their own or all in the tile's program), alternated
over rounds in one process: capture, then for every (batch, q) shape fill the graph's
buffers with a verify step of q tokens a sequence (``run_verify``), check its logits are
the same bits under both settings, and time bare replays (median of 5 x 50). Shapes over
16 rows run the layered kernels under both settings (a check of the bench's noise).

Usage (GPU): ``PYTHONPATH=$PWD python bench/stack_shapes.py --out $OUT/stack_shapes.json``
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from mmserve.bench.engine_run import BLOCK_SIZE, PagedDecoder, random_cuda_model
from mmserve.bench.limits import cuda_time_ms
from mmserve.engine.cuda_graphs import DecodeGraphs
from mmserve.kernels import triton_decode_stack
from mmserve.kernels.decode_stack import decode_stack_enabled, set_decode_stack_enabled

SIZES = (1, 2, 4, 8, 16)
QSIZES = (1, 2, 3, 5, 9)
SHAPES = ((1, 1), (1, 2), (1, 3), (1, 5), (1, 9), (2, 5), (4, 1), (4, 3), (8, 2), (16, 1),
          (2, 9), (4, 5))


# setting -> the stack on?, its TUNING ("stack_serial": every tile's splits in one program)
# "engine": the stack as the engine runs it, the serial-split graph while a step's keys
# are within DecodeGraphs.serial_max_keys (the other settings capture no such graph)
SETTINGS = {"layered": (False, {}), "stack": (True, {"spread": True}),
            "stack_serial": (True, {"spread": False}), "engine": (True, {"spread": True})}


@torch.inference_mode()
def measure(model, dec: PagedDecoder, setting: str, tokens: dict, prompt: int) -> dict:
    """Capture under one setting -> per shape: replay time (us) and the step's logits."""
    stack, tuning = SETTINGS[setting]
    set_decode_stack_enabled(stack)
    triton_decode_stack.TUNING.update(tuning)
    graphs = DecodeGraphs(model, dec.kv, dec.per_seq, SIZES, QSIZES)
    if setting != "engine":
        graphs.serial_max_keys = 0
    report = graphs.capture()
    out = {"capture_s": report.seconds, "shapes": {}}
    for bs, q in SHAPES:
        toks = tokens[(bs, q)]
        serial = graphs.serial_replays
        logits, _, _ = graphs.run_verify(toks, [prompt] * bs, dec.tables[:bs], BLOCK_SIZE)
        logits = logits.clone()
        graph = (graphs.serial[(bs, q)][0] if graphs.serial_replays > serial
                 else graphs.graphs[(bs, q)])
        us = cuda_time_ms(lambda g=graph: [g.replay() for _ in range(50)], repeats=5,
                          warmup=1) * 20
        out["shapes"][f"{bs}x{q}"] = {"replay_us": us, "logits": logits}
    del graphs
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128, help="cached tokens a sequence")
    ap.add_argument("--out", default="stack_shapes.json")
    args = ap.parse_args()
    model, cfg = random_cuda_model(args.model)
    dec = PagedDecoder(model, max(SIZES), max(512, args.prompt + 32))
    rng = np.random.default_rng(0)
    dec.prefill([rng.integers(0, cfg["vocab_size"], args.prompt).tolist() for _ in range(16)])
    tokens = {(bs, q): [rng.integers(0, cfg["vocab_size"], q).tolist() for _ in range(bs)]
              for bs, q in SHAPES}
    default = decode_stack_enabled()
    runs: list[tuple[int, str, dict]] = []
    for rnd in range(args.rounds):
        order = list(SETTINGS) if rnd % 2 == 0 else list(SETTINGS)[::-1]
        for name in order:
            r = measure(model, dec, name, tokens, args.prompt)
            runs.append((rnd, name, r))
            print(rnd, name, f"capture {r['capture_s']:.1f} s", flush=True)
    set_decode_stack_enabled(default)
    triton_decode_stack.TUNING["spread"] = True
    ref = next(r for _, n, r in runs if n == "layered")["shapes"]
    rows = []
    for shape in ref:
        row: dict = {"shape": shape, "rows": int(shape.split("x")[0]) * int(shape.split("x")[1])}
        for name in SETTINGS:
            times = [r["shapes"][shape]["replay_us"] for _, n, r in runs if n == name]
            row[f"{name}_us"] = times
        row["same_bits"] = all(torch.equal(r["shapes"][shape]["logits"], ref[shape]["logits"])
                               for _, _, r in runs)
        row["ratio_best"] = min(row["stack_us"]) / min(row["layered_us"])
        rows.append(row)
    print(f"{'shape':>6} {'rows':>4} " + " ".join(f"{n + ' us':>16}" for n in SETTINGS)
          + "  ratio bits")
    for r in rows:
        cols = " ".join(f"{'/'.join(f'{t:.0f}' for t in r[n + '_us']):>16}" for n in SETTINGS)
        print(f"{r['shape']:>6} {r['rows']:>4} {cols} {r['ratio_best']:6.3f} "
              f"{'same' if r['same_bits'] else 'DIFFER'}")
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "model": args.model,
                   "prompt": args.prompt, "rows": rows,
                   "capture_s": {f"{rnd}_{n}": r["capture_s"] for rnd, n, r in runs}}, f,
                  indent=1)


if __name__ == "__main__":
    main()
