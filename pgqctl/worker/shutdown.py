"""How a worker stops: on its first signal it claims nothing more and lets
its jobs finish within --grace; at the end of the grace period, on a second
signal, or when it cannot go on (a standby, a lost supervisor), its jobs are
stopped now (SIGTERM, then SIGKILL). Results the database cannot take are
waited for REPORT_WAIT seconds before the worker gives up and exits 1.

No database, no processes, no logging: the loop tells it what happened and
asks what is due.
"""

from __future__ import annotations

from pgqctl.worker.config import REPORT_WAIT


class Shutdown:
    def __init__(self) -> None:
        self.signals = 0
        self.stopping = False  # claims nothing more
        self.now = False  # stop the jobs without waiting for the grace period
        self.children_stopped = False  # every job was asked to stop
        self.grace_deadline = 0.0
        self.report_deadline: float | None = None

    def signalled(self, now: float, grace: float, running: int) -> bool:
        """A stop signal: whether the running jobs get a grace period (the
        first signal, with a grace and jobs to finish) or stop now."""
        self.signals += 1
        self.stopping = True
        if self.signals == 1 and grace > 0 and running:
            self.grace_deadline = now + grace
            return True
        self.now = True
        return False

    def at_once(self, children_stopped: bool = False) -> None:
        """Stop now, without a grace period (the worker cannot go on);
        `children_stopped` when nothing is left to stop."""
        self.stopping = True
        self.now = True
        self.children_stopped = self.children_stopped or children_stopped

    def children_due(self, now: float) -> bool:
        """Whether the running jobs must be asked to stop now."""
        if not self.stopping or self.children_stopped:
            return False
        return self.now or now >= self.grace_deadline

    def give_up_reporting(self, now: float, connected: bool) -> bool:
        """Stopping with results the database cannot take: wait a little,
        then give up (True)."""
        if not self.stopping or connected:
            return False
        if self.report_deadline is None:
            self.report_deadline = now + REPORT_WAIT
            return False
        return now >= self.report_deadline

    def deadlines(self) -> list[float]:
        """When the loop must look again: the end of the grace period, of the
        wait for reports."""
        due = []
        if self.stopping and not self.children_stopped:
            due.append(self.grace_deadline)
        if self.report_deadline is not None:
            due.append(self.report_deadline)
        return due
