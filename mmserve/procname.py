"""OS-visible names for the server's processes and threads.

Python (before 3.14) leaves a thread's kernel name at its process's, so ``top -H``,
``py-spy`` and ``mmserve bench serve``'s CPU accounting could not tell the engine's step
loop from the event loop. ``name_this_thread`` writes the calling thread's kernel name
(``/proc/thread-self/comm``, 15 bytes at most); called on a process's main thread it
names the process. Where there is no such file (not Linux) it does nothing.
"""

from __future__ import annotations

COMM_MAX = 15  # the kernel's TASK_COMM_LEN less its NUL


def name_this_thread(name: str) -> None:
    try:
        with open("/proc/thread-self/comm", "w") as f:
            f.write(name[:COMM_MAX])
    except OSError:
        pass
