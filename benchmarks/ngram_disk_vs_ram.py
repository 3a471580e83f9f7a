"""N-gram table on disk (memory-mapped) against in RAM: look-up and engine step time.

Builds a table from a synthetic corpus of ~4M tokens (tens of MB on disk), drops it from
the page cache where the OS allows (posix_fadvise DONTNEED), then times (1) raw look-ups
and (2) whole engine runs with ``method: ngram_table`` from disk and from RAM, same
prompts, same run. Writes JSON to argv[1].

Usage: PYTHONPATH=$PWD python benchmarks/ngram_disk_vs_ram.py [bench_out/ngram_disk_vs_ram.json]
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from mmserve import LLM, SamplingParams
from mmserve.speculative.ngram_build import build_table
from mmserve.speculative.ngram_table import NgramTable


def drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def lookups(table: NgramTable, contexts: list[list[int]]) -> float:
    start = time.perf_counter()
    for c in contexts:
        table.lookup(c, 8)
    return (time.perf_counter() - start) / len(contexts)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench_out/ngram_disk_vs_ram.json")
    llm_probe = LLM()
    tok = llm_probe.tokenizer
    rng = random.Random(0)
    base = [
        tok.encode(t)
        for t in (
            "The river town woke slowly and the ferry bell rang.",
            "def add(a, b):\n    return a + b\n",
            "Sales rose by eight percent while costs fell.",
        )
    ]
    phrases = [[rng.randrange(49152) for _ in range(10)] for _ in range(100000)]
    corpus = [
        [*rng.choice(base), *[t for _ in range(20) for t in rng.choice(phrases)]]
        for _ in range(20000)
    ]  # ~4M tokens of phrases that recur: a big table
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "table.bin"
        build_table(corpus, path, n=3, max_continuation=8, min_count=2)
        size = path.stat().st_size
        docs = [rng.choice(corpus) for _ in range(20000)]
        contexts = [d[i : i + 3] for d in docs for i in [rng.randrange(len(d) - 3)]]
        hits = sum(bool(NgramTable(path).lookup(c, 8)) for c in contexts[:2000])
        drop_page_cache(path)
        cold = lookups(NgramTable(path), contexts)
        warm = lookups(NgramTable(path), contexts)
        ram = lookups(NgramTable(path, in_memory=True), contexts)
        prompts = ["Repeat exactly: The river town woke slowly and the ferry bell rang."] * 4
        params = SamplingParams(temperature=0, max_tokens=48)
        runs = {}
        for name, in_memory in (("disk", False), ("ram", True)):
            drop_page_cache(path)
            llm = LLM(
                speculative_config={
                    "method": "ngram_table",
                    "table_path": str(path),
                    "table_in_memory": in_memory,
                    "num_speculative_tokens": 4,
                }
            )
            start = time.perf_counter()
            res = llm.generate(prompts, params)
            secs = time.perf_counter() - start
            steps = sum(len(r.token_ids) for r in res)
            runs[name] = {
                "seconds": secs,
                "tok_s": steps / secs,
                "token_ids": [r.token_ids for r in res],
            }
    report = {
        "table_bytes": size,
        "lookup_hit_rate": hits / 2000,
        "lookup_us": {
            "disk_cold_cache": cold * 1e6,
            "disk_warm_cache": warm * 1e6,
            "ram": ram * 1e6,
        },
        "engine_tok_s": {k: v["tok_s"] for k, v in runs.items()},
        "same_tokens": runs["disk"]["token_ids"] == runs["ram"]["token_ids"],
    }
    print(json.dumps(report, indent=2))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
