"""CPU time of a process tree, per process and per thread, read from ``/proc`` (Linux).

``mmserve bench serve`` takes a ``snapshot`` of the server's tree (the server, and in the
split layout its engine core and API servers) before and after each load; ``usage`` turns
two snapshots into each process's CPU share over the load and its busiest threads (named
by the server: ``mmserve-engine`` is a step loop, ``mmserve-api*`` an event loop; see
``mmserve.procname``). A thread at ~1.0 is what holds that load back; a process whose
threads together sit near 1.0 while none is alone there is bound by its GIL.
"""

from __future__ import annotations

import os
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
PROC = Path("/proc")

Snapshot = dict[tuple[int, int], tuple[str, str, int]]  # (pid, tid) -> names, ticks


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (those alive now)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in _listdir(PROC / str(p) / "task"):
            todo += [int(c) for c in _read(PROC / str(p) / "task" / task / "children").split()]
    return out


def snapshot(pid: int) -> Snapshot:
    """Every thread of ``pid``'s tree: (process name, thread name, user + system ticks)."""
    snap: Snapshot = {}
    for p in tree(pid):
        pname = _read(PROC / str(p) / "comm").strip()
        for task in _listdir(PROC / str(p) / "task"):
            stat = _read(PROC / str(p) / "task" / task / "stat")
            if not stat:
                continue
            tname = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            snap[(p, int(task))] = (pname, tname, int(fields[11]) + int(fields[12]))
    return snap


def usage(before: Snapshot, after: Snapshot, wall_s: float, top: int = 3) -> dict[str, dict]:
    """Each process's CPU share (1.0 = one core busy) over ``wall_s``, with its ``top``
    busiest threads as ``[name, share]``; a process is keyed by its name (and its pid
    where two share one)."""
    if wall_s <= 0:
        return {}
    procs: dict[int, tuple[str, list[tuple[str, float]]]] = {}
    for key, (pname, tname, ticks) in after.items():
        busy = (ticks - before.get(key, (pname, tname, 0))[2]) * TICK_S / wall_s
        procs.setdefault(key[0], (pname, []))[1].append((tname, busy))
    names = [n for n, _ in procs.values()]
    out = {}
    for pid, (pname, threads) in sorted(procs.items()):
        threads.sort(key=lambda t: -t[1])
        out[pname if names.count(pname) == 1 else f"{pname} ({pid})"] = {
            "cpu": round(sum(b for _, b in threads), 3),
            "threads": [[t, round(b, 3)] for t, b in threads[:top]],
        }
    return out


def busiest_thread(use: dict[str, dict]) -> tuple[str, float] | None:
    """The busiest thread of the whole tree, as ``("process/thread", share)``."""
    threads = ((f"{p}/{t}", b) for p, u in use.items() for t, b in u["threads"])
    return max(threads, key=lambda x: x[1], default=None)


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:  # the process (or thread) is gone
        return []


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
