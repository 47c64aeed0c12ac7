"""Resident handlers without a worker: whatever goes wrong around a job's
exchange with its handler, the job still gets its one result."""

from __future__ import annotations

import os
import threading

import pytest

from pgqctl import resident, runner


def test_an_unforeseen_error_still_reports_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    results: list[tuple[object, resident.ResidentResult]] = []
    reported = threading.Event()

    def on_done(key: object, result: resident.ResidentResult) -> None:
        results.append((key, result))
        reported.set()

    jobs = resident.ResidentJobs(
        {"k": ["cat"]}, {}, on_started=lambda key, pid: None, on_done=on_done
    )

    def broken(kind: str, stop: runner.Stop) -> None:
        raise RuntimeError("the process table is full")

    monkeypatch.setattr(jobs, "_take", broken)
    request = {"id": 1, "attempt": 1, "claim": 1, "kind": "k", "queue": "default", "payload": {}}
    jobs.submit("job-1", request=request, timeout=None, stop=runner.Stop())
    assert reported.wait(5)
    [(key, result)] = results
    assert key == "job-1"
    assert result.outcome.error == (
        "worker error running the resident handler: the process table is full"
    )
    jobs.close()


def test_an_error_once_its_process_runs_reports_the_job_and_ends_the_process() -> None:
    results: list[resident.ResidentResult] = []
    reported = threading.Event()
    pids: list[int] = []

    def on_started(key: object, pid: int) -> None:
        pids.append(pid)
        raise RuntimeError("the log is gone")

    def on_done(key: object, result: resident.ResidentResult) -> None:
        results.append(result)
        reported.set()

    jobs = resident.ResidentJobs({"k": ["cat"]}, {}, on_started=on_started, on_done=on_done)
    request = {"id": 1, "attempt": 1, "claim": 1, "kind": "k", "queue": "default", "payload": {}}
    jobs.submit("job-1", request=request, timeout=None, stop=runner.Stop())
    assert reported.wait(5)
    [result] = results
    assert result.outcome.error == "worker error running the resident handler: the log is gone"
    [pid] = pids
    with pytest.raises(ProcessLookupError):  # killed and reaped, not kept for the next job
        os.kill(pid, 0)
    jobs.close()
