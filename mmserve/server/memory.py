"""Give freed heap memory back to the operating system.

glibc keeps freed blocks of a large arena for reuse, so after a session that held
megabytes of text is gone the process's RSS stays up until ``malloc_trim`` returns
the free pages. Where there is no glibc (macOS, musl) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim_heap() -> bool:
    """Return free heap pages to the OS; True when the C library could do it."""
    fn = _malloc_trim()
    return bool(fn is not None and fn(0))
