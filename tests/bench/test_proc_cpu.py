"""The serve bench's CPU accounting: a real child process with a named busy thread."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from mmserve.bench import proc_cpu

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

CHILD = """
import threading, time
from mmserve.procname import name_this_thread

def spin():
    name_this_thread("busy-loop")
    end = time.monotonic() + 30
    while time.monotonic() < end:
        pass

def rest():
    name_this_thread("resting")
    time.sleep(30)

name_this_thread("mmserve-test")
for f in (spin, rest):
    threading.Thread(target=f, daemon=True).start()
print("ready", flush=True)
time.sleep(30)
"""


def test_a_named_busy_thread_is_found_in_a_child_tree():
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys, time\n"
            f"c = subprocess.Popen([sys.executable, '-c', {CHILD!r}])\ntime.sleep(30)",
        ],
    )
    try:
        deadline = time.monotonic() + 20
        while len(proc_cpu.tree(parent.pid)) < 2 or not any(
            t == "busy-loop" for _, t, _ in proc_cpu.snapshot(parent.pid).values()
        ):
            assert time.monotonic() < deadline, "the child never named its threads"
            time.sleep(0.05)
        before, start = proc_cpu.snapshot(parent.pid), time.monotonic()
        time.sleep(1.0)
        use = proc_cpu.usage(before, proc_cpu.snapshot(parent.pid), time.monotonic() - start)
    finally:
        for pid in reversed(proc_cpu.tree(parent.pid)):
            subprocess.run(["kill", str(pid)], check=False)
        parent.wait(10)
    child = use["mmserve-test"]
    names = dict(child["threads"])
    # a spinning thread is on a core most of the time even on a loaded 2-core host
    assert names["busy-loop"] > 0.3, use
    assert names.get("resting", 0.0) < 0.05, use
    assert child["cpu"] >= names["busy-loop"]
    assert proc_cpu.busiest_thread(use) == ("mmserve-test/busy-loop", names["busy-loop"])
    assert use[next(k for k in use if k != "mmserve-test")]["cpu"] < 0.2  # the idle parent


def test_usage_of_no_time_is_empty():
    assert proc_cpu.usage({}, {}, 0.0) == {}
