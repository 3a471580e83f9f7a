"""``mmserve bench voice``: many voice streams on one engine, deadline against FIFO.

For each voice (``voice_targets``), each stream count and each scheduling mode, the same
load runs on the same engine (weights, KV cache and CUDA graphs shared; the mode is
switched between loads): ``n`` streams arrive evenly over ``ramp_s``, each speaking
``seconds`` of audio; every stream's client (``mmserve.playback_client``) buffers
``buffer_s`` before it plays. A mixed load adds text clients (a 512-token prompt, 64
tokens out, one request after another) to the voice streams on the same engine. The
engine is driven in this thread, on the wall clock, as the server's engine loop drives it.

Per load: time to first audio (p50/p95/max), the share of streams that played without an
underrun, the worst gap, per-stream real-time factor, streams refused by admission control,
and for text clients time to first token and inter-token latency. Writes ``voice.json``
and ``voice.png`` (first-audio latency and underruns against stream count).
"""

from __future__ import annotations

import copy
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from mmserve.bench.voice_targets import (
    VoiceTarget,
    default_voice_target,
    engine_options,
    gepard_target,
)
from mmserve.engine.playback import AudioSpec
from mmserve.playback_client import StreamLog, play
from mmserve.sampling_params import SamplingParams

TEXT_PROMPT, TEXT_OUT = 512, 64


def run_load(
    target: VoiceTarget,
    mode: str,
    streams: int,
    seconds: float,
    ramp_s: float,
    buffer_s: float,
    first_audio_s: float,
    text_clients: int = 0,
) -> dict[str, Any]:
    """One load on ``target``'s engine -> its row of the report."""
    eng = target.engine
    assert not eng.has_unfinished(), "loads run one at a time on an idle engine"
    eng.scheduler.policy.mode = mode
    logs: dict[str, StreamLog] = {}
    texts: dict[str, dict[str, float]] = {}
    arrivals = [(i * ramp_s / streams, i) for i in range(streams)]
    t0 = time.monotonic()
    tag = f"{mode}-{streams}-{int(t0 * 1000)}"
    clients = [f"text{c}" for c in range(text_clients)]
    busy: dict[str, str] = {}  # text client -> its request in flight
    while arrivals or any(not log.finish for log in logs.values()):
        now = time.monotonic() - t0
        while arrivals and arrivals[0][0] <= now:
            _, i = arrivals.pop(0)
            rid = f"{tag}-s{i}"
            prompt, params = target.request(i, seconds)
            spec = AudioSpec(
                rid,
                target.frame_s,
                target.tokens_per_frame,
                buffer_s=buffer_s,
                first_audio_s=first_audio_s,
                first_chunk_frames=max(1, round(0.04 / target.frame_s)),
                max_chunk_frames=max(1, round(0.32 / target.frame_s)),
            )
            logs[rid] = StreamLog(now)
            eng.add_request(prompt, params, rid, audio=spec)
            target.open(rid, i)
        for c in clients:
            if c not in busy:
                busy[c] = _text_request(eng, f"{tag}-{c}-{len(texts)}", len(texts), texts, now)
        for out in target.step():
            now = time.monotonic() - t0
            log = logs.get(out.request_id)
            if log is not None:
                if out.new_token_ids or (out.finished and out.finish_reason != "overloaded"):
                    seconds_out = target.chunk_seconds(out)
                    if seconds_out > 0:
                        log.chunks.append((now, seconds_out))
                if out.finished:
                    log.finish = out.finish_reason
            elif out.request_id in texts:
                _text_output(texts[out.request_id], out, now)
                if out.finished:
                    busy = {c: r for c, r in busy.items() if r != out.request_id}
        if eng._ran_nothing:
            wait = eng.idle_for()
            if arrivals:
                wait = min(wait or 1e9, arrivals[0][0] - (time.monotonic() - t0))
            time.sleep(max(0.0, min(wait, 0.05)))
    for rid in busy.values():
        eng.abort(rid)
    while eng.has_unfinished():
        target.step()
    return _row(mode, streams, text_clients, logs, texts, buffer_s)


def _text_request(eng: Any, rid: str, i: int, texts: dict, now: float) -> str:
    vocab = eng.model.vocab_size
    prompt = [(31 * i + 7 * j) % (vocab - 2) + 1 for j in range(TEXT_PROMPT)]
    eng.add_request(
        prompt, SamplingParams(temperature=0, max_tokens=TEXT_OUT, ignore_eos=True), rid
    )
    texts[rid] = {"arrival": now, "tokens": 0}
    return rid


def _text_output(rec: dict, out: Any, now: float) -> None:
    if out.new_token_ids and "first" not in rec:
        rec["first"] = now
    if out.new_token_ids:
        rec["tokens"], rec["last"] = len(out.token_ids), now


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _row(
    mode: str,
    streams: int,
    text_clients: int,
    logs: dict[str, StreamLog],
    texts: dict,
    buffer_s: float,
) -> dict[str, Any]:
    plays = [p for p in (play(log, buffer_s) for log in logs.values()) if p is not None]
    ttfa = [p.ttfa_s * 1000 for p in plays]
    gaps = [p.worst_gap_s * 1000 for p in plays]
    row: dict[str, Any] = {
        "mode": mode,
        "streams": streams,
        "text_clients": text_clients,
        "served": len(plays),
        "refused": sum(log.refused for log in logs.values()),
        "ttfa_ms": {"p50": _pct(ttfa, 0.5), "p95": _pct(ttfa, 0.95), "max": _pct(ttfa, 1.0)},
        "no_underrun_share": (sum(g == 0 for g in gaps) / len(gaps)) if gaps else None,
        "worst_gap_ms": {"p50": _pct(gaps, 0.5), "p95": _pct(gaps, 0.95), "max": _pct(gaps, 1.0)},
        "rtf": {
            "p50": _pct([p.rtf for p in plays], 0.5),
            "p95": _pct([p.rtf for p in plays], 0.95),
        },
    }
    started = [r for r in texts.values() if "first" in r]
    if text_clients:  # a request the load's end cut short counts with the tokens it got
        row["text"] = {
            "requests": len(started),
            "tokens": sum(r["tokens"] for r in started),
            "ttft_ms_p50": _pct([(r["first"] - r["arrival"]) * 1000 for r in started], 0.5),
            "itl_ms_p50": _pct(
                [
                    (r["last"] - r["first"]) * 1000 / (r["tokens"] - 1)
                    for r in started
                    if r["tokens"] > 1
                ],
                0.5,
            ),
        }
    return row


def run_voice_bench(
    voices: list[str],
    streams: list[int],
    seconds: float,
    device: str,
    out_dir: str,
    buffer_ms: float = 200.0,
    ramp_s: float = 1.0,
    first_audio_ms: float = 150.0,
    text_clients: int = 16,
    mixed_streams: list[int] | None = None,
    tiny: bool = False,
    time_limit_s: float = 420.0,
) -> dict[str, Any]:
    start = time.monotonic()
    mixed = [s for s in (mixed_streams or [max(streams) // 2]) if s > 0]
    opts = engine_options(max(streams + mixed), text_clients, device)
    result: dict[str, Any] = {
        "machine": _machine(),
        "seconds": seconds,
        "buffer_ms": buffer_ms,
        "ramp_s": ramp_s,
        "first_audio_target_ms": first_audio_ms,
        "voices": {},
    }
    for name in voices:
        try:
            target = (
                gepard_target(opts, tiny)
                if name.startswith("gepard")
                else default_voice_target(opts, None if name == "default" else name)
            )
        except (FileNotFoundError, ValueError, ImportError) as exc:  # e.g. no default voice
            print(f"{name}: skipped ({exc})", flush=True)
            result["voices"][name] = {"skipped": str(exc)}
            continue
        args = (seconds, ramp_s, buffer_ms / 1000, first_audio_ms / 1000)
        run_load(target, "fifo", min(streams), *args)  # warm-up: graphs, caches, step cost
        rows = []
        for n in streams:
            _warm_level(target, n, args)
            for mode in ("deadline", "fifo"):
                if time.monotonic() - start > time_limit_s:
                    break
                rows.append(run_load(target, mode, n, *args))
                print(_line(target.name, rows[-1]), flush=True)
        if target.stage is None:  # mixed load on the text-capable backbone
            for n in mixed:
                for mode in ("deadline", "fifo"):
                    if time.monotonic() - start > time_limit_s:
                        break
                    rows.append(run_load(target, mode, n, *args, text_clients=text_clients))
                    print(_line(target.name, rows[-1]), flush=True)
        result["voices"][target.name] = {
            "frame_ms": target.frame_s * 1000,
            "tokens_per_frame": target.tokens_per_frame,
            "loads": rows,
        }
        del target
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "voice.json").write_text(json.dumps(result, indent=1))
    from mmserve.bench.voice_report import plot, table

    print(table(result))
    if not plot(result, out / "voice.png"):
        print(
            f"no matplotlib here: plot elsewhere with python -m mmserve.bench.voice_report "
            f"{out / 'voice.json'}",
            flush=True,
        )
    return result


def _warm_level(target: VoiceTarget, streams: int, args: tuple) -> None:
    """A short FIFO load of ``streams`` streams before the level's measured loads, so the
    first of them (deadline) pays no first use of a batch size (a compile, an allocator
    growth) that the second (FIFO) would not. Its steps do not reach admission's step-cost
    fit: the fit is put back as it was, so the measured loads start from the same fit as
    without this warm-up, minus the one-off costs."""
    policy = target.engine.scheduler.policy
    cost = copy.deepcopy(policy.cost)  # ``record`` updates the fit in place
    run_load(target, "fifo", streams, min(args[0], 1.0), *args[1:])
    policy.cost = cost
    policy.idle()


def _line(name: str, row: dict) -> str:
    t, g = row["ttfa_ms"], row["worst_gap_ms"]
    share = row["no_underrun_share"]
    text = f"  text itl p50 {_ms(row['text']['itl_ms_p50'])}" if "text" in row else ""
    return (
        f"{name} {row['mode']:<8} n={row['streams']:<4} served {row['served']:<4} "
        f"refused {row['refused']:<4} ttfa p50 {_ms(t['p50'])} p95 {_ms(t['p95'])}  "
        f"no-underrun {'-' if share is None else f'{100 * share:.0f}%'}  "
        f"worst gap max {_ms(g['max'])}{text}"
    )


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}ms"


def _machine() -> dict[str, Any]:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "gpu": gpu,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
