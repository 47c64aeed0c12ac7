"""How the worker stops and when it tries the database again, without a
database: the grace period, a second signal, giving up on reports, and
the reconnect and refusal waits growing and starting short again."""

from __future__ import annotations

import pytest

from pgqctl.worker.config import RECONNECT_CAP, RECONNECT_FIRST, REPORT_WAIT
from pgqctl.worker.retry import Retry
from pgqctl.worker.shutdown import Shutdown


def test_the_first_signal_gives_running_jobs_the_grace_period() -> None:
    stop = Shutdown()
    assert not stop.children_due(0.0)
    assert stop.signalled(100.0, grace=30.0, running=2)
    assert stop.stopping and not stop.now
    assert not stop.children_due(129.9)
    assert stop.children_due(130.0)
    assert 130.0 in stop.deadlines()


def test_a_second_signal_stops_the_jobs_at_once() -> None:
    stop = Shutdown()
    stop.signalled(100.0, grace=30.0, running=2)
    assert not stop.signalled(101.0, grace=30.0, running=2)
    assert stop.children_due(101.0)


@pytest.mark.parametrize(("grace", "running"), [(0.0, 3), (30.0, 0)])
def test_without_a_grace_or_without_jobs_a_signal_stops_now(grace: float, running: int) -> None:
    stop = Shutdown()
    assert not stop.signalled(100.0, grace=grace, running=running)
    assert stop.children_due(100.0)


def test_jobs_are_asked_to_stop_once() -> None:
    stop = Shutdown()
    stop.at_once()
    assert stop.children_due(0.0)
    stop.children_stopped = True
    assert not stop.children_due(1.0)
    assert stop.deadlines() == []


def test_a_stopping_worker_waits_for_the_database_then_gives_up_on_its_reports() -> None:
    stop = Shutdown()
    assert not stop.give_up_reporting(0.0, connected=False)  # not stopping: wait for ever
    stop.signalled(0.0, grace=0.0, running=0)
    assert not stop.give_up_reporting(1.0, connected=True)
    assert not stop.give_up_reporting(1.0, connected=False)  # the wait starts
    assert stop.deadlines() == [0.0, 1.0 + REPORT_WAIT]
    assert not stop.give_up_reporting(REPORT_WAIT, connected=False)
    assert stop.give_up_reporting(1.0 + REPORT_WAIT, connected=False)


def test_reconnects_wait_longer_each_time_up_to_the_cap_then_start_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("random.uniform", lambda low, high: 1.0)  # no jitter
    retry = Retry(0.0)
    assert retry.may_reconnect(0.0)
    retry.lost(10.0)
    assert retry.reconnect_at == 10.0 + RECONNECT_FIRST
    assert not retry.may_reconnect(10.0)
    waits = []
    for _ in range(10):
        before = retry.reconnect_delay
        retry.reconnect_failed(20.0)
        waits.append(before)
    assert waits[:3] == [RECONNECT_FIRST * 2, RECONNECT_FIRST * 4, RECONNECT_FIRST * 8]
    assert max(waits) == RECONNECT_CAP
    assert retry.restored(25.0) == 15.0  # away since the first loss
    retry.lost(40.0)
    assert retry.reconnect_at == 40.0 + RECONNECT_FIRST


def test_a_refusing_server_holds_the_worker_back_longer_while_it_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("random.uniform", lambda low, high: 1.0)
    retry = Retry(0.0)
    assert not retry.refusing(0.0)
    first = retry.refused(100.0)
    assert first == RECONNECT_FIRST and retry.refusing(100.0)
    assert not retry.refusing(100.0 + first)
    second = retry.refused(100.0 + first)
    assert second == 2 * RECONNECT_FIRST
    # After a quiet while, a new refusal starts short again.
    assert retry.refused(1000.0) == RECONNECT_FIRST
