"""Schedules cannot be wiped by accident: an empty sync file is refused, each
file's sync touches only its own source's schedules, and a schedule whose
previous tick's job has not ended skips its ticks (overlap skip)."""

from __future__ import annotations

import datetime as dt
import json
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqctl import db
from tests.conftest import run_cli
from tests.integration import test_worker
from tests.integration.test_schedules import ticker_at

start_worker = test_worker.start_worker  # the fixture, for these tests too

UTC = dt.timezone.utc

TEAM_A = """
[schedules.a-nightly]
cron = "0 3 * * *"
kind = "report"

[schedules.a-beat]
every = "30s"
kind = "ping"
"""

TEAM_B = """
[schedules.b-hourly]
every = "1h"
kind = "digest"
"""


def cli(dsn: str, *args: str, input: str | None = None) -> Any:
    return run_cli(*args, "--dsn", dsn, input=input)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def names(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM schedules ORDER BY name").fetchall()]


def changes(result: Any) -> list[tuple[str, str]]:
    assert result.exit_code == 0, result.stderr
    return [(c["action"], c["name"]) for c in json.loads(result.stdout)]


@pytest.mark.parametrize("text", ["", "# schedules.toml\n# (rendered by the template)\n"])
def test_a_sync_file_with_no_schedule_is_refused_unless_allow_empty(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, text: str
) -> None:
    path = write(tmp_path, "schedules.toml", TEAM_A)
    assert cli(dsn, "schedule", "sync", path).exit_code == 0
    truncated = write(tmp_path, "schedules.toml", text)
    for dry in ((), ("--dry-run",)):
        refused = cli(dsn, "schedule", "sync", truncated, *dry)
        assert refused.exit_code == 2
        assert refused.stderr == (
            f"pgqctl: error: {truncated} names no schedule (empty, or only comments): syncing "
            "it would remove every schedule of source 'schedules.toml'; give --allow-empty "
            "if that is meant\n"
        )
    assert names(conn) == ["a-beat", "a-nightly"]
    emptied = cli(dsn, "schedule", "sync", truncated, "--allow-empty", "--json")
    assert changes(emptied) == [("remove", "a-beat"), ("remove", "a-nightly")]
    assert names(conn) == []


def test_each_files_sync_removes_only_the_schedules_of_its_own_source(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    assert cli(dsn, "schedule", "add", "by-hand", "--every", "1m", "k").exit_code == 0
    team_a = write(tmp_path, "team-a.toml", TEAM_A)
    team_b = write(tmp_path, "team-b.toml", TEAM_B)
    assert changes(cli(dsn, "schedule", "sync", team_a, "--json")) == [
        ("add", "a-beat"),
        ("add", "a-nightly"),
    ]
    # Team B's sync neither removes nor would remove team A's, nor the one by hand.
    dry = cli(dsn, "schedule", "sync", team_b, "--dry-run", "--json")
    assert changes(dry) == [("add", "b-hourly")]
    assert changes(cli(dsn, "schedule", "sync", team_b, "--json")) == [("add", "b-hourly")]
    assert changes(cli(dsn, "schedule", "sync", team_a, "--json")) == []
    assert names(conn) == ["a-beat", "a-nightly", "b-hourly", "by-hand"]
    shown = json.loads(cli(dsn, "schedule", "show", "a-beat", "--json").stdout)
    assert (shown["source"], shown["sync_source"]) == ("file", "team-a.toml")

    # Team A drops one: only team A's sync removes it.
    team_a = write(tmp_path, "team-a.toml", TEAM_A.split("[schedules.a-beat]")[0])
    assert changes(cli(dsn, "schedule", "sync", team_b, "--json")) == []
    assert changes(cli(dsn, "schedule", "sync", team_a, "--json")) == [("remove", "a-beat")]

    # A file naming another source's schedule is refused, and nothing changes.
    before = conn.execute("SELECT * FROM schedules ORDER BY name").fetchall()
    taken = write(
        tmp_path, "team-b.toml", TEAM_B + '[schedules.a-nightly]\nevery = "1m"\nkind = "x"'
    )
    refused = cli(dsn, "schedule", "sync", taken)
    assert refused.exit_code == 2
    assert refused.stderr.startswith(
        "pgqctl: error: schedule 'a-nightly' belongs to source 'team-a.toml', not 'team-b.toml'"
    )
    assert conn.execute("SELECT * FROM schedules ORDER BY name").fetchall() == before

    # --source names the source whatever the file's name; stdin needs one.
    piped = cli(dsn, "schedule", "sync", "-", input=TEAM_B)
    assert piped.exit_code == 2 and "give --source NAME to sync from stdin" in piped.stderr
    moved = cli(dsn, "schedule", "sync", "-", "--source", "team-b.toml", "--json", input=TEAM_B)
    assert changes(moved) == []
    nameless = cli(dsn, "schedule", "sync", team_b, "--source", " ")
    assert nameless.exit_code == 2 and "--source is empty" in nameless.stderr


def test_schedules_synced_before_sources_belong_to_the_file_that_names_them(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    team_a = write(tmp_path, "team-a.toml", TEAM_A)
    assert cli(dsn, "schedule", "sync", team_a).exit_code == 0
    conn.execute("UPDATE schedules SET sync_source = NULL")  # as the upgrade leaves them
    team_b = write(tmp_path, "team-b.toml", TEAM_B)
    synced = cli(dsn, "schedule", "sync", team_b, "--json")
    assert changes(synced) == [("add", "b-hourly")]
    assert "2 schedules made by a sync before sources existed belong to no source" in (
        synced.stderr
    )
    adopted = cli(dsn, "schedule", "sync", team_a, "--json")
    assert json.loads(adopted.stdout) == [
        {"action": "update", "name": "a-beat", "fields": ["source"]},
        {"action": "update", "name": "a-nightly", "fields": ["source"]},
    ]
    assert names(conn) == ["a-beat", "a-nightly", "b-hourly"]


def enqueue_due(dsn: str, now: dt.datetime) -> list[Any]:
    """What a worker's ticker enqueues when the database's clock says `now`."""
    with db.open_queue(dsn, schema="public", writes=True) as queue_conn:
        ticker = ticker_at(queue_conn, now, "all")
        return ticker._enqueue(queue_conn, ticker._due())


def test_a_tick_while_the_previous_ticks_job_is_pending_or_running_is_skipped(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    assert cli(dsn, "schedule", "add", "slow", "--every", "1m", "k").exit_code == 0
    many = cli(dsn, "schedule", "add", "many", "--every", "1m", "k", "--overlap", "allow")
    assert many.exit_code == 0, many.stderr
    start = dt.datetime(2026, 10, 22, tzinfo=UTC)
    conn.execute("UPDATE schedules SET ticks_after = %s", (start,))
    minute = dt.timedelta(minutes=1)

    def jobs(name: str) -> list[tuple[Any, ...]]:
        return conn.execute(
            "SELECT tick, status FROM jobs WHERE schedule = %s ORDER BY tick", (name,)
        ).fetchall()

    def shown(name: str) -> dict[str, Any]:
        return json.loads(cli(dsn, "schedule", "show", name, "--json").stdout)

    # Three ticks due at once (catch-up all): skip enqueues the latest only.
    enqueue_due(dsn, start + 3 * minute + dt.timedelta(seconds=1))
    assert jobs("slow") == [(start + 3 * minute, "pending")]
    assert len(jobs("many")) == 3
    record = shown("slow")
    assert (record["overlap"], record["skipped_ticks"]) == ("skip", 2)
    assert record["last_skipped_tick"] == "2026-10-22T00:02:00+00:00"

    # The next tick while that job runs: skipped, and done with all the same.
    conn.execute("UPDATE jobs SET status = 'running' WHERE schedule = 'slow'")
    [skipped] = [e for e in enqueue_due(dsn, start + 4 * minute) if e.schedule == "slow"]
    assert (skipped.jobs, skipped.skipped) == ((), (start + 4 * minute,))
    assert len(jobs("slow")) == 1 and len(jobs("many")) == 4
    record = shown("slow")
    assert (record["skipped_ticks"], record["last_tick"]) == (3, "2026-10-22T00:04:00+00:00")

    # Once it has ended, the next tick is enqueued.
    conn.execute("UPDATE jobs SET status = 'done' WHERE schedule = 'slow'")
    enqueue_due(dsn, start + 5 * minute)
    assert jobs("slow")[-1] == (start + 5 * minute, "pending")
    assert shown("slow")["skipped_ticks"] == 3


def test_a_slow_job_of_a_secondly_schedule_does_not_pile_up_behind_itself(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    payload = '{"argv": ["sleep", "2.5"]}'
    added = cli(dsn, "schedule", "add", "slow", "--every", "1s", "k", payload)
    assert added.exit_code == 0, added.stderr
    worker = start_worker(dsn, "--concurrency", "4", "--no-reap")
    worker.wait_for_log(" started: ")
    most = 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        [(live,)] = conn.execute(
            "SELECT count(*) FROM jobs WHERE status IN ('pending', 'running')"
        ).fetchall()
        most = max(most, live)
        time.sleep(0.05)
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0
    [(made,)] = conn.execute("SELECT count(*) FROM jobs").fetchall()
    print(f"6 s of a 1 s schedule of 2.5 s jobs: {made} jobs, at most {most} at once")
    assert most == 1  # one job of the schedule at a time: no backlog
    [(skipped,)] = conn.execute("SELECT skipped_ticks FROM schedules").fetchall()
    assert skipped >= 3 and made <= 4
    assert "schedule tick(s) (overlap skip" in worker.log
