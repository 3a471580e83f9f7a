"""On-disk format of the global n-gram table (written by ``ngram_build``, read by ``ngram_table``).

Layout (all little-endian)::

    [0, 64)          header: HEADER_DTYPE, zero-padded to HEADER_SIZE bytes
    [64, 64 + S*R)   S = num_slots records of entry_dtype(max_continuation), R bytes each

The records form an open-addressing hash table with linear probing: a context of
``n`` tokens hashes (``hash_context``) to a 64-bit key; its home slot is
``key & (num_slots - 1)``; key 0 marks an empty slot (a real hash of 0 is stored as 1).
The table is never full, so every probe sequence ends at an empty slot.

``data_crc32`` covers the records; it is checked only by ``NgramTable.verify()`` because
checking it at open would read the whole file. ``header_crc32`` covers the header
bytes before it and is checked at every open.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

MAGIC = b"MMNGRAM\x00"
VERSION = 1
HEADER_SIZE = 64
HASH_SEED = 0x6D6D73657276655F  # "mmserve_"
_MASK64 = (1 << 64) - 1

HEADER_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("n", "<u4"),
        ("max_continuation", "<u4"),
        ("min_count", "<u4"),
        ("num_slots", "<u8"),
        ("num_entries", "<u8"),
        ("hash_seed", "<u8"),
        ("data_crc32", "<u4"),
        ("header_crc32", "<u4"),  # crc32 of every header byte before this field
    ]
)
assert HEADER_DTYPE.itemsize <= HEADER_SIZE


class NgramTableError(ValueError):
    """The table file is missing, corrupt, truncated or of another format version."""


def entry_dtype(max_continuation: int) -> np.dtype:
    """One hash-table record: the context key, counts and the continuation tokens."""
    return np.dtype(
        [
            ("key", "<u8"),  # hash_context of the n context tokens; 0 = empty slot
            ("count", "<u4"),  # occurrences of context + the whole stored continuation
            ("context_count", "<u4"),  # occurrences of the context
            ("length", "<u4"),  # number of valid tokens in `tokens`
            ("tokens", "<i4", (max_continuation,)),
        ]
    )


def records_crc32(records: np.ndarray, chunk: int = 1 << 16) -> int:
    """``zlib.crc32`` of the records' bytes, computed chunk by chunk (no full copy)."""
    crc = 0
    for start in range(0, records.shape[0], chunk):
        crc = zlib.crc32(records[start : start + chunk].tobytes(), crc)
    return crc


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def hash_context(tokens: Sequence[int]) -> int:
    """64-bit key of a context, stable across processes and Python versions; never 0."""
    h = HASH_SEED
    for token in tokens:
        h = _splitmix64(h ^ (int(token) & 0xFFFFFFFF))
    return h or 1


def hash_windows(windows: np.ndarray) -> np.ndarray:
    """``hash_context`` of each row of ``windows`` (shape ``(m, n)``), vectorised -> (m,) u8."""
    h = np.full(windows.shape[0], HASH_SEED, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(windows.shape[1]):
            x = h ^ (windows[:, j].astype(np.uint64) & np.uint64(0xFFFFFFFF))
            x = x + np.uint64(0x9E3779B97F4A7C15)
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            h = x ^ (x >> np.uint64(31))
    h[h == 0] = 1
    return h


def make_header(
    n: int, max_continuation: int, min_count: int, num_slots: int, num_entries: int, data_crc32: int
) -> np.ndarray:
    """A filled header record; ``data_crc32`` is ``zlib.crc32`` of the record bytes."""
    header = np.zeros(1, dtype=HEADER_DTYPE)
    header["magic"] = MAGIC
    header["version"] = VERSION
    header["n"] = n
    header["max_continuation"] = max_continuation
    header["min_count"] = min_count
    header["num_slots"] = num_slots
    header["num_entries"] = num_entries
    header["hash_seed"] = HASH_SEED
    header["data_crc32"] = data_crc32
    header["header_crc32"] = _header_crc(header)
    return header


_CRC_OFFSET = HEADER_DTYPE.itemsize - 4  # header_crc32 is the last field
assert HEADER_DTYPE.names is not None and HEADER_DTYPE.names[-1] == "header_crc32"


def _header_crc(header: np.ndarray) -> int:
    return zlib.crc32(header.tobytes()[:_CRC_OFFSET])


def read_header(path: Path) -> np.void:
    """Read and validate the header of ``path``; raise ``NgramTableError`` saying what is wrong."""
    hint = "rebuild it with `mmserve ngram build corpus.jsonl table.bin`"
    if not path.is_file():
        raise NgramTableError(f"n-gram table {path} does not exist; {hint}")
    with path.open("rb") as f:
        raw = f.read(HEADER_SIZE)
    if len(raw) < HEADER_SIZE or raw[:8] != MAGIC:
        raise NgramTableError(f"{path} is not an mmserve n-gram table (bad magic); {hint}")
    header = np.frombuffer(raw[: HEADER_DTYPE.itemsize], dtype=HEADER_DTYPE).copy()
    if int(header["version"][0]) != VERSION:
        raise NgramTableError(
            f"{path} has format version {int(header['version'][0])}, this mmserve reads "
            f"version {VERSION}; {hint}"
        )
    if int(header["header_crc32"][0]) != _header_crc(header):
        raise NgramTableError(f"{path} has a corrupt header (checksum mismatch); {hint}")
    h = header[0]
    slots, entries = int(h["num_slots"]), int(h["num_entries"])
    if slots < 2 or slots & (slots - 1) or entries >= slots or int(h["n"]) < 1:
        raise NgramTableError(f"{path} has an inconsistent header; {hint}")
    expected = HEADER_SIZE + slots * entry_dtype(int(h["max_continuation"])).itemsize
    actual = path.stat().st_size
    if actual != expected:
        raise NgramTableError(
            f"{path} is {actual} bytes but its header describes {expected} bytes "
            f"(truncated or corrupt); {hint}"
        )
    return h
