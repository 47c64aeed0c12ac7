"""When to report a job that just ended: at once, or a moment later beside
the jobs about to end too.

Each exchange is a round trip and a commit, and a slot whose job ended
waits for it before its next job is claimed. When jobs are shorter than an
exchange (a resident handler's answer, a `true`), reporting each end at once
splits the slots into groups that take turns: one group's exchange runs
while the other's jobs end and wait for the next, so each exchange carries
a few jobs and every slot waits for two. Waiting a little for the jobs
expected to end soon lets one exchange report and replace them all, as a
database's group commit does.

The wait is bounded: it starts at the first unreported end, lasts at most
an exchange's time (as recently measured) and never more than `CAP` (the
loop's wait counts whole milliseconds, so it may end up to one later), and
is taken only while a running job is expected to end within it, from the
recent run time of jobs of its kind. Jobs much longer than an exchange
never wait. No database, no clock of its own: the loop passes the times.
"""

from __future__ import annotations

from collections.abc import Iterable

from pgqctl.worker.slots import Running

# The longest a report waits for other jobs to end, in seconds.
CAP = 0.002
# Weight of the newest figure in each moving average: a few jobs or
# exchanges are enough to follow a change of load.
_NEWEST = 0.25
# Run times kept for this many kinds at most (the ones seen last): a worker
# of every kind meets whatever kinds producers make up.
_KINDS = 256


class Linger:
    def __init__(self) -> None:
        self.exchange = 0.0  # seconds an exchange takes, averaged; 0 until one is timed
        self.run_time: dict[str, float] = {}  # seconds a job of each kind runs, averaged
        self.first_end: float | None = None  # the oldest end not yet reported

    def exchanged(self, seconds: float) -> None:
        """An exchange went out and was answered in `seconds`: every end
        seen before it is reported."""
        self.exchange = _average(self.exchange or seconds, seconds)
        self.first_end = None

    def ended(self, running: Running, at: float) -> None:
        """A job ended at `at` and waits to be reported."""
        if self.first_end is None:
            self.first_end = at
        if running.began:
            kind = running.job.kind
            seconds = at - running.began
            last = self.run_time.pop(kind, seconds)
            if len(self.run_time) >= _KINDS:
                del self.run_time[next(iter(self.run_time))]  # the one seen longest ago
            self.run_time[kind] = _average(last, seconds)

    def until(self, now: float, running: Iterable[Running]) -> float | None:
        """How long the report waits: None to send it now, else until when
        (unless a job ends before)."""
        if self.first_end is None or not self.exchange:
            return None
        window = min(self.exchange, CAP)
        last = self.first_end + window
        if now >= last:
            return None
        for job in running:
            typical = self.run_time.get(job.job.kind)
            # Expected within the window, or just overdue (ends are uneven).
            if typical is not None and job.began and now - window <= job.began + typical <= last:
                return last
        return None


def _average(average: float, newest: float) -> float:
    return average + _NEWEST * (newest - average)
