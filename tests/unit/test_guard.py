"""The guard: stops the job process groups a worker left behind when it died."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

from pgqctl.guard import Guard, watch
from tests.conftest import alive, gone


def group_leader(*argv: str) -> subprocess.Popen[bytes]:
    """A process in a group of its own, as the worker starts jobs."""
    return subprocess.Popen(argv, start_new_session=True)


def test_watch_follows_the_groups_until_the_pipe_closes() -> None:
    r, w = os.pipe()
    os.write(w, b"+10\n+11\n-10\n+12")
    os.write(w, b"\n-99\n")
    os.close(w)
    assert watch(r) == {11, 12}
    os.close(r)


def test_groups_left_when_the_worker_goes_are_stopped(capfd: pytest.CaptureFixture[str]) -> None:
    stubborn = group_leader("sh", "-c", 'trap "" TERM; sleep 30')
    polite = group_leader("sleep", "30")
    finished = group_leader("sleep", "30")
    guard = Guard(0.5, "json")
    try:
        time.sleep(0.1)  # the shell has set its trap
        for proc in (stubborn, polite, finished):
            guard.started(proc.pid)
        guard.ended(finished.pid)  # as if this job had ended: not the guard's any more
        guard.close(timeout=10)  # the pipe closes with two groups listed
        assert stubborn.wait(5) == -9  # SIGKILL after the grace
        assert polite.wait(5) == -15  # SIGTERM sufficed
        assert alive(finished.pid)
    finally:
        for proc in (stubborn, polite, finished):
            proc.kill()
            proc.wait()
    [line] = capfd.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["event"] == "orphans_stopped"
    assert record["groups"] == sorted([stubborn.pid, polite.pid])
    assert record["worker_pid"] == os.getpid()


def test_a_worker_that_ended_its_jobs_leaves_the_guard_nothing_to_do(
    capfd: pytest.CaptureFixture[str],
) -> None:
    guard = Guard(0.5, "text")
    job = group_leader("true")
    guard.started(job.pid)
    job.wait()
    guard.ended(job.pid)
    guard.close(timeout=10)
    assert gone(guard.pid)
    assert capfd.readouterr().err == ""


def test_a_guard_that_is_gone_is_not_written_to_again() -> None:
    guard = Guard(0.5, "text")
    os.kill(guard.pid, 9)
    assert gone(guard.pid, within=5)
    guard._proc.wait()
    guard.started(1)  # EPIPE: noted, not raised
    assert guard.lost
    guard.close()


def test_a_guard_that_stops_reading_is_given_up_without_holding_the_worker() -> None:
    guard = Guard(0.5, "text")
    os.kill(guard.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        for pgid in range(100_000):  # far more than the pipe holds
            guard.started(pgid + 10**9)
        assert time.monotonic() - started < 30  # not held for ever
        assert guard.lost
        guard._proc.wait(5)  # killed: it would act on a stale list
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(guard.pid, signal.SIGCONT)
    guard.close()
