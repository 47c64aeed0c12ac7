"""The worker's loop deciding when a finished job's report goes, without a
database: a clock of the test's own, jobs put in the slots by hand, and an
exchange that only records what it was asked to send."""

from __future__ import annotations

import io
import types
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from pgqctl import runner
from pgqctl.jobs import Job
from pgqctl.worker import loop
from pgqctl.worker.config import WorkerConfig
from pgqctl.worker.outbox import Finished, Outbox
from pgqctl.worker.slots import Running
from pgqctl.worklog import WorkLog

EXCHANGE = 0.001  # what the exchanges took, as the worker measured them


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Sent:
    """One exchange: the claim's limit, how many ends it reported, and
    whether it moved prefetched jobs to their slots."""

    limit: int
    reported: int
    moved: bool


@dataclass
class Loop:
    worker: loop.Worker
    clock: Clock
    sent: list[Sent] = field(default_factory=list)

    def claim(self, *ids: int) -> list[Running]:
        """Jobs claimed into free slots (and prefetched beyond them), started now."""
        claimed = [Job(id=i, queue="default", kind="k", payload={}, attempts=1) for i in ids]
        slots = self.worker.slots
        started = slots.claimed(claimed, slots.free_for(len(claimed)), self.clock.now)
        for running in started:
            running.began = self.clock.now
        return started

    def end(self, running: Running, after: float) -> None:
        self.clock.now += after
        self.worker._finished(Finished(running, runner.Outcome(exit_code=0), at=self.clock.now))


@pytest.fixture
def worker_loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[Loop]:
    clock = Clock()
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(monotonic=clock))
    config = WorkerConfig(
        concurrency=2,
        prefetch=1,
        reap_every=None,
        archive_after=None,
        schedules=False,
        heartbeat=3600.0,
        history=False,
    )
    worker = loop.Worker(config, lambda: None, WorkLog(io.StringIO(), "text"))  # type: ignore[arg-type, return-value]
    worker.conn = object()  # type: ignore[assignment]  # connected, as far as the loop knows
    worker.upkeep.next_heartbeat = worker.next_renew = clock.now + 3600
    worker.claim_wanted = False
    monkeypatch.setattr(
        worker.executor, "launch", lambda running: setattr(running, "began", clock.now)
    )
    state = Loop(worker, clock)

    def exchange(limit: int, renew: bool, beat: bool = False) -> None:
        reported = len(worker.outbox.report().finished())
        state.sent.append(Sent(limit, reported, bool(worker.slots.slotted)))
        worker.outbox = Outbox(config.backoff, None)
        worker.slots.moved()
        worker.linger.exchanged(EXCHANGE)
        worker.claim_wanted = False
        worker.next_poll = clock.now + 3600

    monkeypatch.setattr(worker, "_exchange", exchange)
    worker.linger.exchanged(EXCHANGE)
    worker.linger.run_time["k"] = 0.0002  # jobs of kind k take 0.2 ms
    try:
        yield state
    finally:
        worker.listener.close()


def test_a_report_waits_for_the_job_about_to_end_and_both_go_in_one_exchange(
    worker_loop: Loop,
) -> None:
    first, second = worker_loop.claim(1, 2)
    worker_loop.end(first, after=0.0002)
    worker_loop.worker._act()
    assert worker_loop.sent == []  # the second is due within an exchange's time
    # The loop sleeps until the wait is over, not before: a claim it holds
    # back (its poll long past) does not wake it meanwhile.
    worker_loop.worker.next_poll = 0.0
    assert worker_loop.worker._next_deadline() == pytest.approx(1000.0002 + EXCHANGE, abs=1e-9)
    worker_loop.end(second, after=0.0001)
    worker_loop.worker._act()
    assert worker_loop.sent == [Sent(limit=3, reported=2, moved=False)]


def test_a_report_waits_no_longer_than_an_exchange(worker_loop: Loop) -> None:
    first, _ = worker_loop.claim(1, 2)
    worker_loop.end(first, after=0.0002)
    worker_loop.worker._act()
    assert worker_loop.sent == []
    worker_loop.clock.now += EXCHANGE  # the other job has not ended after all
    worker_loop.worker._act()
    assert worker_loop.sent == [Sent(limit=2, reported=1, moved=False)]


def test_a_report_does_not_wait_for_a_job_far_from_its_end(worker_loop: Loop) -> None:
    worker_loop.worker.linger.run_time["k"] = 5.0
    first, _ = worker_loop.claim(1, 2)
    worker_loop.end(first, after=0.0002)
    worker_loop.worker._act()
    assert worker_loop.sent == [Sent(limit=2, reported=1, moved=False)]


def test_an_exchange_that_goes_anyway_takes_the_report_and_the_claim(
    worker_loop: Loop,
) -> None:
    first, _ = worker_loop.claim(1, 2, 3)  # 3 waits, prefetched
    worker_loop.end(first, after=0.0001)  # 3 starts in its slot: its move must go out
    worker_loop.worker._act()
    assert worker_loop.sent == [Sent(limit=1, reported=1, moved=True)]


def test_a_stopping_worker_reports_at_once(worker_loop: Loop) -> None:
    first, _ = worker_loop.claim(1, 2)
    worker_loop.worker.stop.signalled(worker_loop.clock.now, grace=30.0, running=2)
    worker_loop.end(first, after=0.0002)
    worker_loop.worker._act()
    assert [s.reported for s in worker_loop.sent] == [1]
