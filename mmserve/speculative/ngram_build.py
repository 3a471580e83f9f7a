"""Offline builder of the global n-gram table (``mmserve ngram build corpus.jsonl table.bin``).

For every context of ``n`` tokens seen in the corpus, the table stores its most
frequent continuation, chosen greedily token by token: the most frequent next token
after the context; then, among the occurrences of context + that token, the most
frequent next token; and so on, up to ``max_continuation`` tokens, stopping where the
count of the chain would fall below ``min_count`` or where sequences mostly end.
Ties go to the smaller token id. Contexts whose first continuation token is seen
fewer than ``min_count`` times are left out.

The whole build is vectorised with numpy. It holds every corpus position in memory
(about ``8 + 4 * (max_continuation + 2)`` bytes per token, plus a sort), which suits
corpora of up to a few hundred million tokens on one machine. Contexts whose 64-bit
hashes collide are merged (negligible at 64 bits).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from mmserve.speculative import ngram_format as fmt


class BuildStats(NamedTuple):
    num_positions: int  # corpus positions that had a context and a next token
    num_contexts: int  # distinct contexts seen
    num_entries: int  # contexts stored (their continuation met min_count)
    num_slots: int
    file_bytes: int


class _Entries(NamedTuple):
    keys: np.ndarray  # (E,) u8
    counts: np.ndarray  # (E,) count of context + full continuation
    context_counts: np.ndarray  # (E,)
    lengths: np.ndarray  # (E,)
    tokens: np.ndarray  # (E, max_continuation) i4, -1 past `lengths`


def build_table(
    sequences: Iterable[Iterable[int]],
    path: str | os.PathLike[str],
    n: int = 3,
    max_continuation: int = 8,
    min_count: int = 2,
    load_factor: float = 0.5,
    num_slots: int | None = None,
) -> BuildStats:
    """Count continuations in ``sequences`` (token ids, one list per document) and write
    the table to ``path`` atomically. ``num_slots`` (a power of two) overrides the size
    otherwise derived from ``load_factor``."""
    _check_args(n, max_continuation, min_count, load_factor)
    hashes, conts = _collect_windows(sequences, n, max_continuation)
    num_contexts = int(np.unique(hashes).size)
    entries = _greedy_continuations(hashes, conts, min_count)
    num_entries = int(entries.keys.size)
    slots = num_slots if num_slots is not None else _slots_for(num_entries, load_factor)
    if slots < 2 or slots & (slots - 1) or slots <= num_entries:
        raise ValueError(
            f"num_slots must be a power of two > {num_entries} (the number of entries), got {slots}"
        )
    records = _hash_table(entries, slots, max_continuation)
    crc = fmt.records_crc32(records)
    header = fmt.make_header(n, max_continuation, min_count, slots, num_entries, crc)
    file_bytes = _write(Path(path), header, records)
    return BuildStats(hashes.size, num_contexts, num_entries, slots, file_bytes)


def build_table_from_jsonl(
    corpus_jsonl: str | os.PathLike[str],
    tokenizer_encode: Callable[[str], list[int]],
    path: str | os.PathLike[str],
    n: int = 3,
    max_continuation: int = 8,
    min_count: int = 2,
    load_factor: float = 0.5,
    num_slots: int | None = None,
) -> BuildStats:
    """``build_table`` over a JSONL corpus whose lines each hold a string ``"text"`` field
    (each text is one sequence: n-grams never span two texts; blank lines are skipped)."""
    sequences = _jsonl_token_ids(Path(corpus_jsonl), tokenizer_encode)
    return build_table(sequences, path, n, max_continuation, min_count, load_factor, num_slots)


def _jsonl_token_ids(corpus: Path, encode: Callable[[str], list[int]]) -> Iterator[list[int]]:
    with corpus.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{corpus}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise ValueError(
                    f'{corpus}:{lineno}: each line must be an object with a "text" string'
                )
            yield encode(obj["text"])


def _check_args(n: int, max_continuation: int, min_count: int, load_factor: float) -> None:
    if n < 1:
        raise ValueError(f"n (context length) must be >= 1, got {n}")
    if not 1 <= max_continuation <= 64:
        raise ValueError(f"max_continuation must be in 1..64, got {max_continuation}")
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    if not 0.0 < load_factor < 1.0:
        raise ValueError(f"load_factor must be in (0, 1), got {load_factor}")


def _slots_for(num_entries: int, load_factor: float) -> int:
    return max(2, 1 << int(np.ceil(np.log2(max(num_entries, 1) / load_factor + 1))))


def _as_token_array(seq: Iterable[int]) -> np.ndarray:
    arr = np.asarray(seq if isinstance(seq, list | tuple | np.ndarray) else list(seq))
    if arr.size and (arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError("each sequence must be a flat list of integer token ids")
    if arr.size and (arr.min() < 0 or arr.max() >= 2**31):
        raise ValueError("token ids must be in [0, 2**31)")
    return arr.astype(np.int64)


def _collect_windows(
    sequences: Iterable[Iterable[int]], n: int, max_continuation: int
) -> tuple[np.ndarray, np.ndarray]:
    """Context hash (P,) u8 and the next ``max_continuation`` tokens (P, M) i4 (-1 past the end)
    of every position P that has ``n`` tokens before it and at least one after."""
    hashes, conts = [np.zeros(0, np.uint64)], [np.zeros((0, max_continuation), np.int32)]
    for seq in sequences:
        arr = _as_token_array(seq)
        if arr.size <= n:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(arr, n)[: arr.size - n]
        padded = np.concatenate([arr, np.full(max_continuation, -1, np.int64)])
        follow = np.lib.stride_tricks.sliding_window_view(padded, max_continuation)[n : arr.size]
        hashes.append(fmt.hash_windows(windows))
        conts.append(follow.astype(np.int32))
    return np.concatenate(hashes), np.concatenate(conts)


def _greedy_continuations(hashes: np.ndarray, conts: np.ndarray, min_count: int) -> _Entries:
    """The greedy most-frequent continuation of every context (see the module docstring)."""
    max_cont = conts.shape[1]
    order = np.lexsort([conts[:, j] for j in reversed(range(max_cont))] + [hashes])
    h, c = hashes[order], conts[order]  # sorted by (context, t1, t2, ...)
    is_start = np.r_[True, h[1:] != h[:-1]] if h.size else np.zeros(0, bool)
    group_of_row = np.cumsum(is_start) - 1
    group_start = np.flatnonzero(is_start)
    num_groups = group_start.size
    tokens = np.full((num_groups, max_cont), -1, np.int32)
    lengths = np.zeros(num_groups, np.int64)
    counts = np.zeros(num_groups, np.int64)
    alive = np.arange(h.size)  # rows that still agree with their group's chosen chain
    for j in range(max_cont):
        if alive.size == 0:
            break
        g, t = group_of_row[alive], c[alive, j]
        run_start = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (t[1:] != t[:-1])])
        run_len = np.diff(np.r_[run_start, alive.size])
        run_group, run_tok = g[run_start], t[run_start]
        # Per group: the longest run; ties to real tokens over "sequence ended", then smaller id.
        ranked = np.lexsort([run_tok, run_tok < 0, -run_len, run_group])
        best = ranked[np.r_[True, run_group[ranked][1:] != run_group[ranked][:-1]]]
        best = best[(run_tok[best] >= 0) & (run_len[best] >= min_count)]
        tokens[run_group[best], j] = run_tok[best]
        lengths[run_group[best]] = j + 1
        counts[run_group[best]] = run_len[best]
        keep = np.zeros(run_start.size, bool)
        keep[best] = True
        alive = alive[np.repeat(keep, run_len)]
    context_counts = np.diff(np.r_[group_start, h.size])
    stored = lengths > 0
    return _Entries(
        h[group_start][stored],
        counts[stored],
        context_counts[stored],
        lengths[stored],
        tokens[stored],
    )


def _hash_table(entries: _Entries, num_slots: int, max_continuation: int) -> np.ndarray:
    """Place entries by linear probing, all pending entries one probe step per round."""
    mask = np.uint64(num_slots - 1)
    home = (entries.keys & mask).astype(np.int64)
    offset = np.zeros(entries.keys.size, np.int64)
    slot_of = np.full(entries.keys.size, -1, np.int64)
    taken = np.zeros(num_slots, bool)
    pending = np.arange(entries.keys.size)
    while pending.size:
        slot = (home[pending] + offset[pending]) & (num_slots - 1)
        free = ~taken[slot]
        won_slot, first = np.unique(slot[free], return_index=True)  # lowest index wins
        winners = pending[free][first]
        taken[won_slot] = True
        slot_of[winners] = won_slot
        pending = pending[slot_of[pending] < 0]
        offset[pending] += 1
    records = np.zeros(num_slots, dtype=fmt.entry_dtype(max_continuation))
    records["key"][slot_of] = entries.keys
    records["count"][slot_of] = np.minimum(entries.counts, 2**32 - 1)
    records["context_count"][slot_of] = np.minimum(entries.context_counts, 2**32 - 1)
    records["length"][slot_of] = entries.lengths
    records["tokens"][slot_of] = entries.tokens
    return records


def _write(path: Path, header: np.ndarray, records: np.ndarray) -> int:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(header.tobytes().ljust(fmt.HEADER_SIZE, b"\x00"))
        records.tofile(f)
    os.replace(tmp, path)
    return path.stat().st_size
