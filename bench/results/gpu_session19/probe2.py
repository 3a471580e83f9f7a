"""Session 19 probe: 8B batch-1 step variants against the default, ABBA pairs, the ahead
decode's step time (the host overlapped): the spread attention graph at 129-228 keys
(the serial graph is the default there), 64-key splits (other bits), silu * up in
gate_up's epilogue (default tile, and 16x32x256 halves)."""
import json
import statistics
import sys

sys.path.insert(0, "bench")
from pdl_trigger_ab import _mlp, use  # noqa: E402

from mmserve.bench.engine_run import batch1_step_baseline  # noqa: E402
from mmserve.kernels import triton_attention, triton_fused, triton_matmul  # noqa: E402
from mmserve.kernels.norm import rms_norm  # noqa: E402
from mmserve.kernels.triton_matmul import TileConfig  # noqa: E402
from mmserve.models import layers  # noqa: E402

out, pairs, only = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
dec, first, report = batch1_step_baseline("llama3-8b")
default_mlp = layers.norm_gate_up_silu


def gated_cfg(cfg):
    def f(x, norm_weight, eps, offset, gate_up):
        if x.numel() > 16 * x.shape[-1]:
            return default_mlp(x, norm_weight, eps, offset, gate_up)
        return triton_fused.gate_up_silu(rms_norm(x, norm_weight, eps, offset), gate_up,
                                         config=cfg)
    return f


_pick = triton_matmul.pick_config
_res = triton_fused.linear_residual
chosen = {}


def picked(m, n):
    return chosen[n] if m <= 16 and n in chosen else _pick(m, n)


def residual(x, weight, r, config=None, late=False):
    k = x.shape[-1]
    if config is None and ("k", k) in chosen and x.numel() <= 16 * k:
        config = chosen[("k", k)]
    return _res(x, weight, r, config, late)


triton_matmul.pick_config = triton_fused.pick_config = picked
triton_fused.linear_residual = residual


def measure(v):
    use({})
    chosen.clear()
    triton_attention.SPLIT = 128
    if v.startswith(("qkv_", "o_", "down_")):
        kind, bn, bk, w, s = v.split("_")
        key = {"qkv": 6144, "o": ("k", 4096), "down": ("k", 14336)}[kind]
        chosen[key] = TileConfig(16, int(bn), int(bk), int(w), int(s))
    if v == "gated":
        layers.norm_gate_up_silu = _mlp(True, False)
    elif v.startswith("gated_"):
        bn, bk, w, s = map(int, v.split("_")[1:])
        layers.norm_gate_up_silu = gated_cfg(TileConfig(16, bn, bk, w, s))
    if v == "split64":
        triton_attention.SPLIT = 64
    dec.capture((1,))
    if v in ("spread", "split64"):
        dec.graphs.serial_max_keys = 0
    a = dec.decode(first, 128, 100, graphs=True, ahead=True)
    use({})
    chosen.clear()
    triton_attention.SPLIT = 128
    return a.seconds / a.steps * 1e3, a.row0


res = {}
for v in only:
    rows, same = [], True
    for p in range(pairs):
        got = {}
        for w in (("d", v) if p % 2 == 0 else (v, "d")):
            got[w] = measure(w)
        same &= got["d"][1] == got[v][1]
        rows.append(got["d"][0] / got[v][0])
    res[v] = {"ratios": rows, "median": statistics.median(rows), "same_tokens": same}
    print(f"{v:<22} default/variant x{statistics.median(rows):.4f} "
          f"{[round(r, 4) for r in rows]} same={same} (default {got['d'][0] * 1e3:.0f} us)",
          flush=True)
report["variants"] = res
json.dump(report, open(out, "w"), indent=1)
