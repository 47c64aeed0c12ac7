"""The jobs a worker holds, and where: running in one of its --concurrency
slots, or prefetched (claimed ahead of a free slot, waiting in claim order).

No database, no processes, no logging: the loop asks the slots what room
there is for a claim, which leases to renew, and which job it holds under a
(job id, attempt); it tells them what it claimed and what ended.
"""

from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass

from pgqctl import runner
from pgqctl.jobs import Held, Job


@dataclass(eq=False)
class Running:
    """A job claimed by this worker whose end has not been reported on."""

    job: Job
    stop: runner.Stop
    slot: int = -1  # which of the --concurrency slots it holds, for the logs
    lost: bool = False  # lease lost: stop the child, drop its result
    # Done by the job's own transaction (pgqctl_complete_job): nothing to
    # renew or report; its program runs on until it exits.
    completed: bool = False
    prefetched: bool = False  # claimed ahead of a free slot, and not started yet
    # When the exchange that claimed it was sent (monotonic), and the slot it
    # ran in (kept after the slot frees): for its attempt's record.
    claimed_at: float = 0.0
    ran_in: int | None = None
    began: float = 0.0  # when it was started (monotonic; 0 until then)
    # Why it ended without this worker, once found: "cancelled", "lease_lost".
    ended_by: str | None = None

    @property
    def holds_lease(self) -> bool:
        return not (self.lost or self.completed)


class Slots:
    """The running jobs by (job id, attempt), the prefetched ones in claim
    order, and the free slot numbers (the lowest given out first)."""

    def __init__(self, concurrency: int, prefetch: int = 0) -> None:
        self.size = concurrency + prefetch
        self.running: dict[Held, Running] = {}
        # Jobs claimed ahead of a free slot (--prefetch), in claim order: each
        # starts as soon as a slot frees. Their leases are renewed with the
        # running ones'.
        self.prefetched: collections.deque[Running] = collections.deque()
        # Prefetched jobs started since the last exchange, with their slot:
        # the next one moves their locked_by from :prefetch to the slot.
        self.slotted: dict[Held, int] = {}
        # Free slot numbers, lowest on top: the logs say which slot runs a job.
        self._free = list(range(concurrency - 1, -1, -1))

    def busy(self) -> bool:
        """Whether any job is held, running or prefetched."""
        return bool(self.running or self.prefetched)

    def room(self) -> int:
        """How many jobs a claim may take: free slots, and room in the local queue."""
        return max(self.size - len(self.running) - len(self.prefetched), 0)

    def free_for(self, limit: int) -> list[int]:
        """The slots the next `limit` jobs claimed would take, in claim order
        (the lowest free ones first); jobs claimed beyond them are prefetched."""
        return self._free[::-1][:limit]

    def claimed(self, jobs: list[Job], slots: list[int], at: float = 0.0) -> list[Running]:
        """Take the jobs claimed by the exchange sent `at`: the first into
        `slots` (as `free_for` gave them), the rest into the local queue. The
        ones to start now."""
        started = min(len(jobs), len(slots))
        del self._free[len(self._free) - started :]
        now = [
            Running(job, runner.Stop(), slot, claimed_at=at, ran_in=slot)
            for job, slot in zip(jobs, slots, strict=False)
        ]
        for running in now:
            self.running[running.job.held] = running
        self.prefetched.extend(
            Running(job, runner.Stop(), prefetched=True, claimed_at=at) for job in jobs[started:]
        )
        return now

    def release(self, running: Running) -> bool:
        """A job ended: forget it and free its slot; whether a slot freed."""
        self.running.pop(running.job.held, None)
        if running.slot < 0:
            return False
        self._free.append(running.slot)
        running.slot = -1
        return True

    def start_prefetched(self) -> Running | None:
        """Move the job prefetched first into a free slot (the one to start), if both exist."""
        if not self.prefetched or not self._free:
            return None
        running = self.prefetched.popleft()
        running.prefetched = False
        running.slot = running.ran_in = self._free.pop()
        self.running[running.job.held] = running
        self.slotted[running.job.held] = running.slot
        return running

    def to_move(self) -> dict[Held, int]:
        """The prefetched jobs started since the last exchange, with their
        slot, for the next one to move there (unless they ended meanwhile: a
        row is changed once per statement)."""
        return {k: n for k, n in self.slotted.items() if k in self.running}

    def moved(self) -> None:
        """An exchange moved them (`to_move`)."""
        self.slotted.clear()

    def leased(self) -> list[Held]:
        """The jobs whose leases this worker renews: running (unless lost or
        completed by the job) and prefetched."""
        held = [r.job.held for r in self.running.values() if r.holds_lease]
        return held + [r.job.held for r in self.prefetched]

    def leases_held(self) -> bool:
        return bool(self.prefetched) or any(r.holds_lease for r in self.running.values())

    def holding(self, key: Held) -> Running | None:
        """The job this worker holds under `key`, running (unless lost) or prefetched."""
        running = self.running.get(key)
        if running is not None:
            return None if running.lost else running
        return next((r for r in self.prefetched if r.job.held == key), None)

    def drop_prefetched(self, running: Running) -> None:
        """A prefetched job leaves the local queue unstarted (cancelled, lease lost)."""
        with contextlib.suppress(ValueError):
            self.prefetched.remove(running)

    def take_prefetched(self) -> list[Running]:
        """Empty the local queue: the jobs it held, in claim order."""
        taken = list(self.prefetched)
        self.prefetched.clear()
        return taken

    def live(self) -> int:
        """The running jobs whose lease is not lost (what a heartbeat reports)."""
        return sum(not r.lost for r in self.running.values())
