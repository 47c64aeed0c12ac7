"""Stop a worker's jobs when the worker dies without stopping them.

A worker killed with `kill -9`, or by the kernel when memory runs out, cannot
stop its jobs. Their leases expire, `reap` hands them to another worker, and
the first attempt could still be running beside the second. The guard is a
small process of its own, started by the worker in a session of its own so
that it outlives it. The worker tells it over a pipe which process groups
its jobs run in: `+PGID` once a job's process exists, `-PGID` just before
the worker reaps it. When the pipe closes, the worker is gone: the guard
sends SIGTERM to every group still listed, SIGKILL to those still there
after the grace, and exits. A worker that stops normally has ended its jobs
first, so its guard finds nothing listed.

The guard writes one log line (in the worker's format) when it stops jobs.
It gets the worker's environment without the database's credentials (it
needs none), and closes its own /proc files to the jobs as the worker does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

from pgqctl.hardening import make_undumpable
from pgqctl.worklog import WorkLog

# Groups per message: "-PGID\n" is at most 9 bytes (pid_max is 2**22), so a
# message stays within PIPE_BUF (4096 on Linux, 512 at the least POSIX allows).
_GROUPS_PER_WRITE = 48


class Guard:
    """The worker's end of the pipe. `started` and `ended` are called by
    whichever thread holds the children at the time, never at once."""

    def __init__(self, grace: float, log_format: str, env: Mapping[str, str] | None = None) -> None:
        """`env`: the guard's environment (default: this one), without the
        database's credentials (`payload.without_credentials`)."""
        if env is None:
            from pgqctl.payload import without_credentials

            env = without_credentials(os.environ)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "pgqctl.guard", repr(grace), log_format, str(os.getpid())],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # out of reach of signals meant for the worker's group
        )
        assert self._proc.stdin is not None
        self._fd = self._proc.stdin.fileno()
        # The children are watched on the thread that writes here: a guard
        # that stops reading (stopped, swapped out) must never hold them up.
        os.set_blocking(self._fd, False)
        self.lost = False  # the guard is gone or was given up: nothing more is sent

    @property
    def pid(self) -> int:
        return self._proc.pid

    def started(self, pgid: int) -> None:
        self._send(b"+%d\n" % pgid)

    def ended(self, *pgids: int) -> None:
        """Groups about to be reaped: one write for many."""
        for i in range(0, len(pgids), _GROUPS_PER_WRITE):
            self._send(b"".join(b"-%d\n" % pgid for pgid in pgids[i : i + _GROUPS_PER_WRITE]))

    def close(self, timeout: float = 2.0) -> None:
        """After the children have been reaped: let the guard exit (it has
        nothing to stop), or make it, if it does not within `timeout` seconds
        (it was stopped: left so, it would keep the worker's stderr open)."""
        assert self._proc.stdin is not None
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _send(self, message: bytes) -> None:
        # At most PIPE_BUF bytes: each write is whole or not at all.
        if self.lost:
            return
        try:
            os.write(self._fd, message)
        except BlockingIOError:
            # 64 KiB of messages unread: a guard that missed one could later
            # signal a group that is no longer a job's. It goes instead.
            self.lost = True
            self._proc.kill()
        except OSError:  # it is gone already
            self.lost = True


def watch(fd: int) -> set[int]:
    """Follow the worker's messages until the pipe closes; the groups still listed."""
    groups: set[int] = set()
    rest = b""
    while chunk := os.read(fd, 65536):
        *lines, rest = (rest + chunk).split(b"\n")
        for line in lines:
            if line[:1] == b"+":
                groups.add(int(line[1:]))
            elif line[:1] == b"-":
                groups.discard(int(line[1:]))
    return groups


def stop_groups(groups: set[int], grace: float) -> None:
    """SIGTERM to each group, SIGKILL to those still there after `grace` seconds."""
    left = {g for g in groups if _signal_group(g, signal.SIGTERM)}
    deadline = time.monotonic() + grace
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {g for g in left if _signal_group(g, 0)}
    for group in left:
        _signal_group(group, signal.SIGKILL)


def _signal_group(pgid: int, signum: int) -> bool:
    """Whether the group still existed."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:  # not ours any more
        return False
    return True


def main(argv: list[str]) -> int:
    make_undumpable()
    grace, log_format, worker = float(argv[0]), argv[1], argv[2]
    # A terminal's Ctrl-C or hang-up is for the worker, which stops its jobs itself.
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    groups = watch(sys.stdin.fileno())
    if groups:
        WorkLog(sys.stderr, log_format).event(
            "orphans_stopped",
            f"worker pid {worker} is gone without stopping {len(groups)} job process "
            f"group(s); stopping them (SIGTERM, SIGKILL after {grace:g}s)",
            worker_pid=int(worker),
            groups=sorted(groups),
        )
        stop_groups(groups, grace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
