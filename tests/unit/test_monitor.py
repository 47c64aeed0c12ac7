"""check's thresholds and their lines, metrics' families, stats' snapshot times: no database."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgqctl import admin, monitor, registry
from pgqctl.jobs import FINISHED, STATUS_NAMES
from pgqctl.output.metrics import metrics_text
from pgqctl.output.stats import emit_stats
from tests.conftest import run_cli


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.25, "0.25s"),
        (45, "45s"),
        (300, "5m"),
        (725, "12m05s"),
        (7200, "2h"),
        (7201, "2h"),
        (7500, "2h05m"),
        (115200, "1d08h"),
        (86400, "1d"),
    ],
)
def test_short_duration_is_a_threshold_spelling(seconds: float, shown: str) -> None:
    assert monitor.short_duration(seconds) == shown


def test_defaults_apply_only_when_no_threshold_is_given() -> None:
    none = dict.fromkeys(monitor.BY_NAME)
    assert monitor.applied(none) == {"max_expired_leases": 0, "stalled": 600}
    # 0 is a threshold: `--max-failed 0` tolerates no failed job.
    assert monitor.applied({**none, "max_failed": 0}) == {"max_failed": 0}


def test_every_threshold_is_an_option_of_check_with_its_help() -> None:
    result = run_cli("check", "--help")
    assert result.exit_code == 0
    help_text = " ".join(result.stdout.split())
    for threshold in monitor.THRESHOLDS:
        assert threshold.option in help_text
    assert "check applies --max-expired-leases 0, --stalled 10m" in help_text
    assert len({t.figure for t in monitor.THRESHOLDS}) == len(monitor.THRESHOLDS)


def test_a_breach_is_above_the_limit_not_at_it() -> None:
    pending = monitor.BY_NAME["max_pending"]
    figures = monitor.QueueFigures(admin.Counts.of(pending=3))
    assert monitor.Figure(pending, pending.read(figures), 3).ok
    assert not monitor.Figure(pending, pending.read(figures), 2).ok
    assert monitor.Figure(pending, pending.read(figures), None).ok  # not applied


def test_min_workers_is_breached_below_the_limit_not_at_it() -> None:
    fewest = monitor.BY_NAME["min_workers"]
    assert fewest.option == "--min-workers"
    figures = monitor.QueueFigures(active_workers=2)
    assert monitor.Figure(fewest, fewest.read(figures), 2).ok
    assert not monitor.Figure(fewest, fewest.read(figures), 3).ok
    assert fewest.breach(1, 2) == "1 active worker serving it (min 2)"


def test_a_worker_with_no_queue_serves_every_queue() -> None:
    fleet = registry.Fleet(active=3, stale=1, active_queues=((), ("emails",), ("sms", "emails")))
    assert [fleet.serving(q) for q in ("emails", "sms", "other")] == [3, 2, 1]
    snapshot = monitor.MetricsSnapshot({"other": admin.Counts()}, {}, fleet=fleet)
    text = metrics_text(monitor.metrics_registry(snapshot)).decode()
    found = {f.name: f for f in text_string_to_metric_families(text)}
    assert {s.labels["state"]: s.value for s in found["pgqctl_workers"].samples} == {
        "active": 3,
        "stale": 1,
    }
    assert [(s.labels["queue"], s.value) for s in found["pgqctl_queue_workers"].samples] == [
        ("other", 1)
    ]


def test_every_status_is_a_series_of_pgqctl_jobs_and_every_finished_one_an_outcome() -> None:
    counts = {"emails": admin.Counts.of(pending=2, failed=1), "sms": admin.Counts()}
    snapshot = monitor.MetricsSnapshot(counts, {"sms": {"done": 4}})
    text = metrics_text(monitor.metrics_registry(snapshot)).decode()
    found = {f.name: f for f in text_string_to_metric_families(text)}
    jobs = {(s.labels["queue"], s.labels["status"]): s.value for s in found["pgqctl_jobs"].samples}
    assert {status for _, status in jobs} == set(STATUS_NAMES)
    assert jobs[("emails", "pending")] == 2 and jobs[("sms", "pending")] == 0
    finished = found["pgqctl_jobs_finished_last_minute"].samples
    assert {s.labels["outcome"] for s in finished} == set(FINISHED)
    assert {(s.labels["queue"], s.labels["outcome"]): s.value for s in finished}[
        ("sms", "done")
    ] == 4


def test_a_done_count_not_counted_has_no_sample() -> None:
    counts = admin.Counts.of(pending=1)
    counts.done_figure = "unknown"
    snapshot = monitor.MetricsSnapshot({"emails": counts}, {})
    text = metrics_text(monitor.metrics_registry(snapshot)).decode()
    assert 'status="done"' not in text and 'status="pending"' in text


def test_watched_stats_carry_the_time_of_the_snapshot(capsys: pytest.CaptureFixture[str]) -> None:
    stats = admin.Stats(admin.Counts.of(pending=1), {"q": admin.Counts.of(pending=1)}, False)
    ts = dt.datetime(2026, 12, 2, 1, 50, 7, tzinfo=dt.timezone.utc)
    emit_stats(stats, "json", ts)
    assert json.loads(capsys.readouterr().out)["ts"] == "2026-12-02T01:50:07+00:00"
    emit_stats(stats, "csv", ts)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ts,queue,") and lines[1].startswith("2026-12-02")
    emit_stats(stats, "plain", ts)
    assert capsys.readouterr().out.splitlines()[0] == "2026-12-02 01:50:07+00:00"
    emit_stats(stats, "json")
    assert "ts" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("bad", ["9464", "host:", "host:99999", ":x"])
def test_listen_needs_host_and_port(bad: str) -> None:
    result = run_cli("metrics", "--listen", bad)
    assert result.exit_code == 2
    assert "HOST:PORT" in result.stderr


def test_watch_and_listen_are_not_read_from_the_environment() -> None:
    from pgqctl.cli import cli

    stats = cli.commands["stats"]
    metrics = cli.commands["metrics"]
    options = {o.name: o for o in [*stats.params, *metrics.params]}
    assert options["watch"].envvar is None and options["listen"].envvar is None
    assert options["textfile"].envvar is None and options["queues"].envvar is None
