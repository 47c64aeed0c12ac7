"""Keep the queue's processes closed to their own jobs.

A job runs as the worker's user, and a process may read the environment
(`/proc/PID/environ`), the memory (`/proc/PID/mem`) and the open files of
any other process of its user: a job could read the database password the
worker was given. On Linux, a process that is not "dumpable" is closed to
every process without CAP_SYS_PTRACE (root has it): its /proc files belong
to root, ptrace and process_vm_readv are refused, and it leaves no core
dump. The kernel makes a process dumpable again at each exec, so each
process of the queue (the worker, its guard) makes itself undumpable, as
early as it can; the jobs it starts are dumpable, as usual.

`/proc/PID/cmdline` stays readable by every process of every user:
`password_in` tells the worker to warn about a password given there.
"""

from __future__ import annotations

import sys

# From <linux/prctl.h>.
_PR_SET_DUMPABLE = 4


def make_undumpable() -> bool:
    """Close this process's /proc files and memory to processes of its own
    user (Linux); False where that cannot be done (another system, or a
    sandbox that refuses prctl)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def password_in(dsn: str) -> bool:
    """Whether a connection string (URL or key=value) holds a password."""
    from psycopg import ProgrammingError, conninfo

    try:
        return bool(conninfo.conninfo_to_dict(dsn).get("password"))
    except ProgrammingError:
        return False
