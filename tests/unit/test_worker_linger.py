"""When a finished job's report waits for the jobs about to end beside it,
without a database: the times are given, as the worker's loop gives them."""

from __future__ import annotations

from pgqctl import runner
from pgqctl.jobs import Job
from pgqctl.worker.linger import CAP, Linger
from pgqctl.worker.slots import Running


def job(kind: str, began: float, job_id: int = 1) -> Running:
    claimed = Job(id=job_id, queue="default", kind=kind, payload={}, attempts=1)
    running = Running(claimed, runner.Stop())
    running.began = began
    return running


def timed(exchange: float = 0.001, **run_times: float) -> Linger:
    """A linger that has seen an exchange of `exchange` seconds and one job
    of each kind run for the given seconds."""
    linger = Linger()
    linger.exchanged(exchange)
    for kind, seconds in run_times.items():
        linger.ended(job(kind, began=1.0), 1.0 + seconds)
    linger.exchanged(exchange)
    return linger


def test_a_report_waits_for_a_job_expected_to_end_within_an_exchange() -> None:
    linger = timed(exchange=0.001, quick=0.0002)
    linger.ended(job("quick", began=10.0), 10.0002)
    sibling = job("quick", began=10.0001, job_id=2)  # expected at 10.0003
    assert linger.until(10.0002, [sibling]) == 10.0002 + 0.001
    # Once the window is over, it goes, whatever still runs.
    assert linger.until(10.0012, [sibling]) is None


def test_a_report_never_waits_for_a_long_job_or_for_one_of_unknown_length() -> None:
    linger = timed(exchange=0.001, quick=0.0002, slow=5.0)
    linger.ended(job("quick", began=10.0), 10.0002)
    assert linger.until(10.0002, [job("slow", began=9.0, job_id=2)]) is None
    assert linger.until(10.0002, [job("never_seen", began=10.0, job_id=3)]) is None
    # A job of a quick kind that has run far past its kind's time: no wait.
    assert linger.until(10.0002, [job("quick", began=5.0, job_id=4)]) is None
    assert linger.until(10.0002, []) is None


def test_the_wait_is_capped_and_none_before_an_exchange_was_timed() -> None:
    linger = timed(exchange=0.5, quick=0.001)
    linger.ended(job("quick", began=10.0), 10.001)
    assert linger.until(10.001, [job("quick", began=10.0005, job_id=2)]) == 10.001 + CAP

    untimed = Linger()
    untimed.ended(job("quick", began=10.0), 10.001)
    assert untimed.until(10.001, [job("quick", began=10.0005, job_id=2)]) is None


def test_the_window_starts_at_the_first_end_not_reported_and_an_exchange_closes_it() -> None:
    linger = timed(exchange=0.001, quick=0.0002)
    linger.ended(job("quick", began=10.0), 10.0002)
    linger.ended(job("quick", began=10.0001, job_id=2), 10.0005)
    third = job("quick", began=10.0004, job_id=3)
    assert linger.until(10.0005, [third]) == 10.0002 + 0.001
    linger.exchanged(0.001)
    assert linger.until(10.0015, [third]) is None  # nothing waits to be reported
