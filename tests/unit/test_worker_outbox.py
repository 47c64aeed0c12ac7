"""The worker's outbox without a database: how a finished job is reported,
what a failed exchange keeps, and how the exchange's answer settles it."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from pgqctl import claims, runner
from pgqctl.jobs import Job
from pgqctl.worker import BACKOFF_CAP
from pgqctl.worker.outbox import Finished, Outbox, job_peak_memory
from pgqctl.worker.slots import Running

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def finished(job_id: int, attempts: int = 1, **outcome: Any) -> Finished:
    job = Job(id=job_id, queue="default", kind="k", payload={}, attempts=attempts)
    return Finished(Running(job, runner.Stop(), slot=0), runner.Outcome(**outcome))


def test_each_ending_is_filed_as_its_report() -> None:
    outbox = Outbox(backoff=2.0)
    assert not outbox
    ok = finished(1, exit_code=0)
    crashed = finished(2, exit_code=3, output_tail="boom")
    stopped = finished(3, signal=15, stopped=True)
    missing = finished(4, start_error="no such program", never_starts=True)
    assert [outbox.add(f) for f in (ok, crashed, stopped, missing)] == ["report"] * 4
    report = outbox.report()
    assert report.done == [ok]
    assert report.handed_back == [stopped]
    [(f1, retry), (f2, never)] = report.fails
    assert (f1, f2) == (crashed, missing)
    assert not retry.permanent and 1.5 <= retry.delay <= 2.5  # 2s, +-25%
    assert never.permanent and never.delay == 0.0
    assert sorted(f.running.job.id for f in report.finished()) == [1, 2, 3, 4]
    assert outbox


def test_a_payload_that_can_never_run_fails_for_good() -> None:
    outbox = Outbox(backoff=2.0)
    rejected = Finished(finished(1).running, runner.Outcome(), rejected="not JSON")
    assert outbox.add(rejected) == "report"
    [(_, failure)] = outbox.report().fails
    assert failure.permanent and failure.error == "not JSON"


def test_the_backoff_grows_with_the_attempt_up_to_its_cap() -> None:
    outbox = Outbox(backoff=2.0)
    outbox.add(finished(1, attempts=4, exit_code=1))
    outbox.add(finished(2, attempts=60, exit_code=1))
    [(_, fourth), (_, sixtieth)] = outbox.report().fails
    assert 12.0 <= fourth.delay <= 20.0  # 2 * 2^3, +-25%
    assert sixtieth.delay == BACKOFF_CAP


@pytest.mark.parametrize(
    ("flags", "expected", "outcome"),
    [
        ({"lost": True, "ended_by": "lease_lost"}, "lost", "lease_lost"),
        ({"lost": True, "ended_by": "cancelled"}, "lost", "cancelled"),
        ({"completed": True}, "by_job", "done"),
    ],
)
def test_jobs_whose_end_was_said_otherwise_are_not_reported_but_recorded(
    flags: dict[str, object], expected: str, outcome: str
) -> None:
    outbox = Outbox(backoff=2.0, worker="h:1")
    f = finished(1, exit_code=0)
    for name, value in flags.items():
        setattr(f.running, name, value)
    assert outbox.add(f) == expected
    assert not outbox.report().finished()
    # Still, the next exchange records how the attempt ended.
    [record] = outbox.report().records
    assert (record.job_id, record.outcome) == (1, outcome)


def test_a_sql_job_reports_nothing_and_one_fenced_out_loses_its_lease() -> None:
    outbox = Outbox(backoff=2.0, worker="h:1")
    committed = Finished(finished(1).running, runner.Outcome(exit_code=0), committed=True)
    fenced = Finished(finished(2).running, runner.Outcome(), fenced_out=True)
    assert outbox.add(committed) == "committed"
    assert outbox.add(fenced) == "fenced_out"
    assert fenced.running.lost
    assert not outbox.report().finished()
    assert [r.outcome for r in outbox.report().records] == ["done", "lease_lost"]


def test_a_failed_exchange_keeps_the_reports_and_remembers_the_dones() -> None:
    outbox = Outbox(backoff=2.0)
    ok = finished(1, exit_code=0)
    outbox.add(ok)
    outbox.add(finished(2, exit_code=1))
    report = outbox.report()
    outbox.unsent(report)
    assert outbox.report() is report and len(report.finished()) == 2
    assert outbox.may_have_reported((1, 1))
    assert not outbox.may_have_reported((2, 1))
    # Reported again and fenced out: the row saying done may be our own report.
    settled = outbox.settle(outbox.report(), claims.Exchanged(failed={}))
    assert [(f.finished, f.tried, f.maybe_ours) for f in settled.fenced_out] == [
        (ok, "done", True),
        (report.fails[0][0], "failed", False),
    ]
    assert not outbox
    assert not outbox.may_have_reported((1, 1))


def test_the_answer_sorts_reports_into_applied_and_fenced_out() -> None:
    outbox = Outbox(backoff=2.0)
    done, gone, failed, back, taken = (
        finished(1, exit_code=0),
        finished(2, exit_code=0),
        finished(3, exit_code=1),
        finished(4, stopped=True, signal=15),
        finished(5, stopped=True, signal=15),
    )
    for f in (done, gone, failed, back, taken):
        outbox.add(f)
    result = claims.FailResult("pending", NOW)
    settled = outbox.settle(
        outbox.report(),
        claims.Exchanged(done={1}, failed={3: result}, handed_back={4}),
    )
    assert settled.done == [done]
    assert [(f, r) for f, _, r in settled.failed] == [(failed, result)]
    assert settled.handed_back == [back]
    assert [(f.finished, f.tried, f.maybe_ours) for f in settled.fenced_out] == [
        (gone, "done", False),
        (taken, "handed back", False),
    ]
    assert settled.requeued  # back in the queue: look for work again
    assert not outbox


def test_nothing_requeued_when_every_failure_was_the_last() -> None:
    outbox = Outbox(backoff=2.0)
    outbox.add(finished(1, exit_code=1))
    settled = outbox.settle(
        outbox.report(), claims.Exchanged(failed={1: claims.FailResult("failed", NOW)})
    )
    assert not settled.requeued


def test_prefetched_jobs_are_handed_back_unstarted() -> None:
    outbox = Outbox(backoff=2.0)
    ahead = [finished(1).running, finished(2).running]
    outbox.hand_back(ahead)
    assert [f.running for f in outbox.report().handed_back] == ahead
    assert all(f.outcome == runner.Outcome() for f in outbox.report().handed_back)


def test_every_ending_is_recorded_as_an_attempt_with_where_and_when() -> None:
    outbox = Outbox(backoff=2.0, worker="h:1")
    endings = {
        "done": finished(1, exit_code=0, duration=2.0),
        "failed": finished(2, exit_code=3, duration=1.0),
        "timed_out": finished(3, signal=15, timed_out=True, timeout=5.0, duration=5.0),
        "handed_back": finished(4, signal=15, stopped=True, duration=1.0),
        "never_started": finished(5, start_error="no such program", never_starts=True),
    }
    rejected = Finished(finished(6).running, runner.Outcome(), rejected="not allowed by policy")
    for f in [*endings.values(), rejected]:
        f.running.ran_in = 0
        f.running.claimed_at = f.at - 10.0
        outbox.add(f)
    records = {r.job_id: r for r in outbox.report().records}
    assert [records[i].outcome for i in range(1, 7)] == [
        "done",
        "failed",
        "timed_out",
        "handed_back",
        "failed",
        "refused",
    ]
    done = records[1]
    assert (done.worker, done.claim, done.attempt, done.exit_status) == ("h:1:0", 1, 1, 0)
    assert done.error is None
    assert done.ended == endings["done"].at and done.started == done.ended - 2.0
    assert done.claimed == done.ended - 10.0
    assert records[2].error == "exit status 3" and records[2].exit_status == 3
    assert records[3].signal == 15 and records[3].error == "timed out after 5s"
    assert records[5].started is None and records[5].error == "no such program"
    assert records[6].started is None and records[6].error == "not allowed by policy"


def test_prefetched_jobs_handed_back_unstarted_are_recorded_without_a_start() -> None:
    outbox = Outbox(backoff=2.0, worker="h:1")
    job = Job(id=9, queue="default", kind="k", payload={}, attempts=2, handbacks=1)
    outbox.hand_back([Running(job, runner.Stop(), prefetched=True, claimed_at=5.0)])
    [record] = outbox.report().records
    assert (record.outcome, record.worker, record.started) == ("handed_back", "h:1:prefetch", None)
    assert (record.claim, record.attempt) == (2, 1)


def test_records_stay_until_an_exchange_goes_through() -> None:
    outbox = Outbox(backoff=2.0, worker="h:1")
    outbox.add(finished(1, exit_code=0))
    report = outbox.report()
    outbox.unsent(report)
    assert len(outbox.report().records) == 1
    outbox.settle(report, claims.Exchanged(done={1}))
    assert outbox.report().records == [] and not outbox


def test_without_history_nothing_is_recorded() -> None:
    outbox = Outbox(backoff=2.0, worker=None)
    outbox.add(finished(1, exit_code=0))
    outbox.hand_back([finished(2).running])
    assert outbox.report().records == []
    assert [f.running.job.id for f in outbox.report().finished()] == [1, 2]


def test_a_record_keeps_each_stream_and_what_the_process_cost() -> None:
    outbox = Outbox(backoff=2.0, worker="h:1")
    big = runner.own_peak_memory() + 10**9
    f = finished(
        1,
        exit_code=1,
        stdout=runner.StreamOutput("head", "tail", 10_000, 9_992),
        stderr=runner.StreamOutput("oops\n", "", 5, 0),
        cpu_user=0.25,
        cpu_system=0.05,
        max_rss_bytes=big,
    )
    f.running.ran_in = 2
    outbox.add(f)
    [record] = outbox.report().records
    assert (record.stdout_head, record.stdout_tail, record.stdout_bytes) == ("head", "tail", 10_000)
    assert (record.stderr_head, record.stderr_tail, record.stderr_bytes) == ("oops\n", "", 5)
    assert (record.user_cpu, record.system_cpu, record.max_rss_bytes) == (0.25, 0.05, big)


def test_a_peak_no_higher_than_the_workers_own_is_not_the_jobs() -> None:
    # The kernel starts a child's peak at its parent's: below that, it says nothing.
    small = finished(1, exit_code=0, max_rss_bytes=runner.own_peak_memory())
    assert job_peak_memory(small.outcome) is None
    assert job_peak_memory(finished(2, exit_code=0).outcome) is None
