"""The global n-gram table (read side) and its drafter.

``NgramTable`` opens a file written by ``mmserve.speculative.ngram_build.build_table``. By
default it memory-maps the file read-only (``numpy.memmap``): opening reads only the
64-byte header, the table costs no accelerator memory and no private RAM, and the OS
pages records in on demand and may drop them under memory pressure. With
``in_memory=True`` the records are read into RAM once at open.

Look-ups must not stall the engine step on a disk read. ``NgramTableDrafter.prefetch``
touches, on a small background thread pool, the records that the next look-ups will
read. The engine calls it as soon as a step's new tokens are appended (before
detokenizing, streaming and scheduling), and calls ``propose`` later in the next step.
``propose`` never waits for the prefetch: a record not yet resident is simply faulted
in by the look-up itself, so results never depend on timing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np

from mmserve.speculative import ngram_format as fmt
from mmserve.speculative.drafter import Draft, Drafter, DraftRequest, empty_draft


class TableHit(NamedTuple):
    tokens: list[int]  # the stored continuation
    continuation_count: int  # occurrences of context + the whole continuation
    context_count: int  # occurrences of the context


class NgramTable:
    """A read-only hash table: last ``n`` tokens -> most frequent continuation."""

    def __init__(self, path: str | os.PathLike[str], in_memory: bool = False) -> None:
        self.path = Path(path)
        header = fmt.read_header(self.path)
        self.n = int(header["n"])
        self.max_continuation = int(header["max_continuation"])
        self.min_count = int(header["min_count"])
        self.num_slots = int(header["num_slots"])
        self.num_entries = int(header["num_entries"])
        self._data_crc32 = int(header["data_crc32"])
        dtype = fmt.entry_dtype(self.max_continuation)
        self.in_memory = in_memory
        if in_memory:
            records = np.fromfile(
                self.path, dtype=dtype, count=self.num_slots, offset=fmt.HEADER_SIZE
            )
        else:
            records = np.memmap(
                self.path, dtype=dtype, mode="r", offset=fmt.HEADER_SIZE, shape=(self.num_slots,)
            )
        self._records = records
        self._keys = records["key"]  # strided views, no copies
        self._mask = self.num_slots - 1

    def lookup(self, context_tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that most often followed the last ``n`` of ``context_tokens``."""
        slot = self._find(context_tokens) if k > 0 else -1
        if slot < 0:
            return []
        record = self._records[slot]
        length = min(int(record["length"]), k)
        return [int(t) for t in record["tokens"][:length]]

    def lookup_with_count(self, context_tokens: Sequence[int]) -> TableHit:
        """The full stored continuation and its counts (empty and zero if absent)."""
        slot = self._find(context_tokens)
        if slot < 0:
            return TableHit([], 0, 0)
        record = self._records[slot]
        tokens = [int(t) for t in record["tokens"][: int(record["length"])]]
        return TableHit(tokens, int(record["count"]), int(record["context_count"]))

    def touch(self, contexts: Sequence[Sequence[int]]) -> None:
        """Read the records that look-ups of ``contexts`` will read (pages them in)."""
        for context in contexts:
            slot = self._find(context)
            if slot >= 0:
                self._records[slot]["tokens"].sum()

    def verify(self) -> None:
        """Check the records' checksum (reads the whole file); raise ``NgramTableError``."""
        if fmt.records_crc32(self._records) != self._data_crc32:
            raise fmt.NgramTableError(
                f"{self.path} failed its data checksum (corrupt); rebuild it with "
                "`mmserve ngram build corpus.jsonl table.bin`"
            )

    def _find(self, context_tokens: Sequence[int]) -> int:
        """Slot holding the key of the last ``n`` tokens, or -1 (linear probing)."""
        if len(context_tokens) < self.n:
            return -1
        key = fmt.hash_context(context_tokens[len(context_tokens) - self.n :])
        slot = key & self._mask
        while True:
            found = int(self._keys[slot])
            if found == key:
                return slot
            if found == 0:
                return -1
            slot = (slot + 1) & self._mask


class NgramTableDrafter(Drafter):
    """Deterministic drafter: the table's continuation of each request's last ``n`` tokens."""

    def __init__(
        self,
        table: NgramTable | str | os.PathLike[str],
        n: int | None = None,
        prefetch_workers: int = 1,
    ) -> None:
        self.table = table if isinstance(table, NgramTable) else NgramTable(table)
        if n is not None and n != self.table.n:
            raise ValueError(
                f"n={n} does not match the table's context length {self.table.n} "
                f"({self.table.path}); rebuild the table with n={n} or pass n={self.table.n}"
            )
        self.n = self.table.n
        self._pool = ThreadPoolExecutor(
            max_workers=prefetch_workers, thread_name_prefix="ngram-prefetch"
        )

    def propose(self, batch: list[DraftRequest]) -> list[Draft]:
        return [
            Draft(tokens=self.table.lookup(r.token_ids, r.k)) if r.k > 0 else empty_draft()
            for r in batch
        ]

    def prefetch(self, batch: list[DraftRequest]) -> Future[None]:
        """Page in, on a background thread, the records ``propose(batch)`` will read.

        Only the last ``n`` tokens of each request are copied now, so the engine may keep
        appending to its buffers. The returned future is for tests and shutdown; the
        engine need not wait on it.
        """
        contexts = [
            list(r.token_ids[max(0, len(r.token_ids) - self.n) :]) for r in batch if r.k > 0
        ]
        return self._pool.submit(self.table.touch, contexts)

    def close(self) -> None:
        """Stop the prefetch thread (pending prefetches are dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
