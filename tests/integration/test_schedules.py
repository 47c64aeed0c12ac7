"""`pgqctl schedule`: the commands, sync, the audit, and the statement that
enqueues ticks, against a real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from cronsim import CronSim

from pgqctl import db, ticks
from tests.conftest import random_name, run_cli

UTC = dt.timezone.utc
# One job per tick, whether or not the previous one has ended.
ALLOW = ("--overlap", "allow")


def cli(dsn: str, *args: str) -> Any:
    return run_cli(*args, "--dsn", dsn)


def schedule_rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT * FROM schedules ORDER BY name").fetchall()


def test_add_list_show_pause_resume_run_remove(dsn: str, conn: psycopg.Connection[Any]) -> None:
    added = cli(
        dsn, "schedule", "add", "nightly", "--cron", "0 3 * * *", "--timezone",
        "Europe/Paris", "report", '{"argv": ["./report.sh"]}', "--queue", "reports",
        "--priority", "5", "--max-attempts", "2", "--json",
    )  # fmt: skip
    assert added.exit_code == 0, added.stderr
    record = json.loads(added.stdout)
    assert record["cron"] == "0 3 * * *" and record["timezone"] == "Europe/Paris"
    assert (record["queue"], record["priority"], record["max_attempts"]) == ("reports", 5, 2)
    assert record["source"] == "cli" and record["last_tick"] is None
    # The next 03:00 in Paris, as the library says.
    now = dt.datetime.now(ZoneInfo("Europe/Paris"))
    expected = next(iter(CronSim("0 3 * * *", now))).astimezone(UTC)
    assert dt.datetime.fromisoformat(record["next_tick"]) == expected
    assert "next tick" in added.stderr

    every = cli(dsn, "schedule", "add", "beat", "--every", "30s", "ping", "--json")
    assert every.exit_code == 0 and json.loads(every.stdout)["every_seconds"] == 30

    listed = cli(dsn, "schedule", "list", "--json")
    assert [s["name"] for s in json.loads(listed.stdout)] == ["beat", "nightly"]
    table = cli(dsn, "schedule", "list", "--format", "plain")
    assert "cron 0 3 * * *" in table.stdout and "every 30s" in table.stdout

    paused = cli(dsn, "schedule", "pause", "nightly", "--json")
    assert json.loads(paused.stdout)["paused"] is True
    assert json.loads(paused.stdout)["next_tick"] is None
    again = cli(dsn, "schedule", "pause", "nightly")
    assert again.exit_code == 0 and "paused already" in again.stderr
    resumed = cli(dsn, "schedule", "resume", "nightly", "--json")
    assert json.loads(resumed.stdout)["paused"] is False

    ran = cli(dsn, "schedule", "run", "nightly", "--json")
    [created] = json.loads(ran.stdout)
    job_id = created["id"]
    shown = json.loads(cli(dsn, "show", str(job_id), "--json").stdout)
    assert (shown["schedule"], shown["tick"], shown["kind"]) == ("nightly", None, "report")
    assert (shown["queue"], shown["priority"], shown["max_attempts"]) == ("reports", 5, 2)
    listed_jobs = cli(dsn, "list", "--format", "plain")
    assert "nightly (run)" in listed_jobs.stdout

    removed = cli(dsn, "schedule", "remove", "nightly")
    assert removed.exit_code == 0
    assert [r[0] for r in schedule_rows(conn)] == ["beat"]
    # Its job stays, with its name.
    assert json.loads(cli(dsn, "show", str(job_id), "--json").stdout)["schedule"] == "nightly"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cron", "0 3 * *", "k"], "Wrong number of fields"),
        (["--cron", "0 25 * * *", "k"], "Bad hour"),
        (["--cron", "0 3 * * *", "--timezone", "Europe/Atlantis", "k"], "Europe/Atlantis"),
        (["--every", "1.5s", "k"], "whole number of seconds"),
        (["--every", "30s", "--timezone", "Europe/Paris", "k"], "--timezone is for --cron"),
        (["k"], "--cron"),
        (["--every", "1s", "k", '{"argv": "ls"}'], "payload cannot run"),
        (["--every", "1s", "k", "[1]"], "payload must be a JSON object"),
        (["--every", "1s", random_name(3000)], "kind is 3,000 characters long: the limit is 128"),
        (["--every", "1s", "k", "--queue", "q\n"], r"queue holds the control character \x0a"),
        (
            ["--every", "1s", "k", '{"s": "' + "x" * 1_100_000 + '"}'],
            "payload is 1,100,008 bytes as JSON: the limit is 1,048,576 bytes",
        ),
    ],
)
def test_bad_input_exits_2_and_adds_nothing(
    dsn: str, conn: psycopg.Connection[Any], args: list[str], says: str
) -> None:
    result = cli(dsn, "schedule", "add", "s", *args)
    assert result.exit_code == 2, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert schedule_rows(conn) == []


def test_a_name_taken_or_unknown_is_said(dsn: str) -> None:
    assert cli(dsn, "schedule", "add", "s", "--every", "1m", "k").exit_code == 0
    taken = cli(dsn, "schedule", "add", "s", "--every", "5m", "k")
    assert taken.exit_code == 2 and "schedule remove s" in taken.stderr
    for command in ("show", "remove", "pause", "resume", "run"):
        unknown = cli(dsn, "schedule", command, "nope")
        assert unknown.exit_code == 2 and "no schedule named 'nope'" in unknown.stderr


FILE = """
[schedules.nightly]
cron = "0 3 * * *"
timezone = "Europe/Paris"
kind = "report"
payload = { argv = ["./report.sh"] }
queue = "reports"

[schedules.beat]
every = "30s"
kind = "ping"
"""


def write(tmp_path: Path, text: str, name: str = "schedules.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_sync_adds_updates_removes_and_twice_is_a_no_op(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # One made by hand, which a sync leaves alone unless --prune-all.
    assert cli(dsn, "schedule", "add", "manual", "--every", "1h", "k").exit_code == 0
    path = write(tmp_path, FILE)
    dry = cli(dsn, "schedule", "sync", path, "--dry-run", "--json")
    assert dry.exit_code == 0, dry.stderr
    assert json.loads(dry.stdout) == [
        {"action": "add", "name": "beat", "fields": []},
        {"action": "add", "name": "nightly", "fields": []},
    ]
    assert [r[0] for r in schedule_rows(conn)] == ["manual"]  # dry: nothing changed

    first = cli(dsn, "schedule", "sync", path, "--json")
    assert [c["action"] for c in json.loads(first.stdout)] == ["add", "add"]
    before = schedule_rows(conn)
    assert [r[0] for r in before] == ["beat", "manual", "nightly"]
    second = cli(dsn, "schedule", "sync", path, "--json")
    assert second.exit_code == 0 and json.loads(second.stdout) == []
    assert "nothing to change" in second.stderr
    assert schedule_rows(conn) == before  # not even updated_at moved

    changed = FILE.replace('every = "30s"', 'every = "1m"').replace("reports", "slow")
    changed = changed.split("[schedules.beat]")[0] + '[schedules.other]\nevery = "5m"\nkind = "o"\n'
    changed = changed.replace("[schedules.nightly]", "[schedules.nightly]\npaused = true")
    path = write(tmp_path, changed)
    third = cli(dsn, "schedule", "sync", path, "--json")
    assert json.loads(third.stdout) == [
        {"action": "remove", "name": "beat", "fields": []},
        {"action": "update", "name": "nightly", "fields": ["queue", "paused"]},
        {"action": "add", "name": "other", "fields": []},
    ]
    names = {r[0] for r in schedule_rows(conn)}
    assert names == {"manual", "nightly", "other"}
    # A schedule made by `add` is never removed by a sync.
    pruned = cli(dsn, "schedule", "sync", path, "--prune-all", "--json")
    assert pruned.exit_code == 2 and "--prune-all is gone" in pruned.stderr
    assert {r[0] for r in schedule_rows(conn)} == names


def test_a_bad_sync_file_exits_2_naming_the_schedule_and_key_and_changes_nothing(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    assert cli(dsn, "schedule", "sync", write(tmp_path, FILE)).exit_code == 0
    before = schedule_rows(conn)
    # The first schedule is fine, the second is not: nothing at all changes.
    bad = (
        FILE.replace('every = "30s"', 'cron = "0 3 * * * * *"')
        + '[schedules.new]\nevery = "1m"\nkind = "n"\n'
    )
    result = cli(dsn, "schedule", "sync", write(tmp_path, bad))
    assert result.exit_code == 2
    assert "schedule 'beat': key 'cron': " in result.stderr and "Wrong number" in result.stderr
    assert schedule_rows(conn) == before


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (random_name(3000), "schedule name is 3,000 characters long: the limit is 128 characters"),
        ("nightly\x1b[2J", r"schedule name holds the control character \x1b at character 8"),
    ],
)
def test_a_schedule_name_over_the_limit_is_refused_by_add_and_sync_and_nothing_is_written(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, name: str, message: str
) -> None:
    added = cli(dsn, "schedule", "add", name, "--every", "1m", "k")
    assert added.exit_code == 2, added.stderr
    assert added.stderr.startswith(f"pgqctl: error: {message}")
    assert len(added.stderr.splitlines()) == 1
    # In a file beside good schedules: none of the file is applied.
    quoted = json.dumps(name)  # a TOML basic string, as JSON spells it
    synced = cli(
        dsn,
        "schedule",
        "sync",
        write(tmp_path, FILE + f'[schedules.{quoted}]\nevery = "1m"\nkind = "k"\n'),
    )
    assert synced.exit_code == 2, synced.stderr
    assert f"schedule {name[:39]!r}"[:-1] in synced.stderr and message in synced.stderr
    assert len(synced.stderr.splitlines()) == 1 and len(synced.stderr) < 400
    assert schedule_rows(conn) == []


def make_due(conn: psycopg.Connection[Any], name: str, ago: str) -> None:
    # As if no worker had run for that long since the schedule was made.
    conn.execute(
        "UPDATE schedules SET ticks_after = now() - %s::interval WHERE name = %s", (ago, name)
    )


def test_check_schedules_exits_3_for_a_missed_tick_until_a_worker_enqueues_it(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    assert cli(dsn, "schedule", "add", "beat", "--every", "10s", "k").exit_code == 0
    assert cli(dsn, "schedule", "add", "idle", "--every", "1h", "k", "--paused").exit_code == 0
    ok = cli(dsn, "check", "--schedules")
    assert ok.exit_code == 0 and ok.stdout == "" and "2 schedules on time" in ok.stderr
    make_due(conn, "beat", "1 minute")
    make_due(conn, "idle", "1 day")  # paused: never missed
    missed = cli(dsn, "check", "--schedules")
    assert missed.exit_code == 3
    [line] = missed.stdout.splitlines()
    assert line.startswith("CRITICAL schedule beat: tick ") and "missed" in line
    listed = json.loads(cli(dsn, "schedule", "list", "--json").stdout)
    assert listed[0]["missed_since"] is not None and listed[1]["missed_since"] is None
    as_json = json.loads(cli(dsn, "check", "--schedules", "--json").stdout)
    assert [s["ok"] for s in as_json["schedules"]] == [False, True]
    assert cli(dsn, "check").exit_code == 0  # without --schedules: not checked

    # A worker comes: --catch-up latest enqueues the latest missed tick.
    worker = run_cli("worker", "--dsn", dsn, "--burst", "--handler", "k=true")
    assert worker.exit_code == 0, worker.stderr
    # The latest missed tick, and one on time if it came within the grace.
    assert re.search(r"enqueued [12] schedule tick\(s\): beat ", worker.stderr)
    assert cli(dsn, "check", "--schedules").exit_code == 0


def ticker_at(conn: db.QueueConnection, now: dt.datetime, catch_up: str) -> ticks.Ticker:
    """A worker's ticker that believes the database's clock says `now`."""
    ticker = ticks.Ticker(catch_up)
    ticker._read(conn)
    ticker.db_now, ticker.read_at = now, ticker.clock()
    return ticker


def test_enqueued_ticks_of_a_cron_in_a_daylight_saving_zone_are_the_librarys(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    expr, zone = "30 2 * * *", "Europe/Paris"
    assert (
        cli(dsn, "schedule", "add", "n", "--cron", expr, "--timezone", zone, "k", *ALLOW).exit_code
        == 0
    )
    # From before the autumn change (02:30 comes twice on 2026-10-25) to after it.
    start = dt.datetime(2026, 10, 22, tzinfo=UTC)
    conn.execute("UPDATE schedules SET ticks_after = %s", (start,))
    now = dt.datetime(2026, 10, 28, 12, tzinfo=UTC)
    with db.open_queue(dsn, schema="public", writes=True) as queue_conn:
        ticker = ticker_at(queue_conn, now, "all")
        ticker._enqueue(queue_conn, ticker._due())
    stored = [r[0] for r in conn.execute("SELECT tick FROM jobs ORDER BY tick").fetchall()]
    expected = []
    for tick in CronSim(expr, start.astimezone(ZoneInfo(zone))):
        if tick > now:
            break
        expected.append(tick.astimezone(UTC))
    assert stored == expected and len(expected) == 7  # the 25th once
    [last] = conn.execute("SELECT last_tick FROM schedules").fetchone() or [None]
    assert last == expected[-1]


def test_a_purged_tick_is_never_enqueued_again_even_by_a_stale_worker(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    assert cli(dsn, "schedule", "add", "n", "--every", "1m", "k", *ALLOW).exit_code == 0
    start = dt.datetime(2026, 10, 22, tzinfo=UTC)
    conn.execute("UPDATE schedules SET ticks_after = %s", (start,))
    now = start + dt.timedelta(minutes=3, seconds=30)
    with db.open_queue(dsn, schema="public", writes=True) as queue_conn:
        stale = ticker_at(queue_conn, now, "all")  # reads the schedule, then sleeps
        fresh = ticker_at(queue_conn, now, "all")
        [done] = fresh._enqueue(queue_conn, fresh._due())
        assert len(done.jobs) == 3
        conn.execute("UPDATE jobs SET status = 'done'")
        assert cli(dsn, "purge", "--older-than", "1ms").exit_code == 0
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
        # The stale worker still believes those ticks due: the schedule's
        # last_tick refuses them, though no job holds them any more.
        assert stale._enqueue(queue_conn, stale._due()) == []
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_workers_racing_on_the_same_ticks_make_one_job_per_tick(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    import threading

    assert cli(dsn, "schedule", "add", "n", "--every", "1m", "k", *ALLOW).exit_code == 0
    start = dt.datetime(2026, 10, 22, tzinfo=UTC)
    conn.execute("UPDATE schedules SET ticks_after = %s", (start,))
    now = start + dt.timedelta(minutes=50, seconds=30)
    racers = 8
    connections = [db.open_queue(dsn, schema="public", writes=True) for _ in range(racers)]
    tickers = [ticker_at(c, now, "all") for c in connections]
    ready = threading.Barrier(racers)
    made: list[int] = []

    def race(ticker: ticks.Ticker, queue_conn: db.QueueConnection) -> None:
        wanted = ticker._due()
        ready.wait()
        for enqueued in ticker._enqueue(queue_conn, wanted):
            made.extend(enqueued.jobs)  # list.extend holds the GIL: safe across threads

    threads = [
        threading.Thread(target=race, args=(t, c))
        for t, c in zip(tickers, connections, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in connections:
        c.close()
    rows = conn.execute("SELECT tick, count(*) FROM jobs GROUP BY tick ORDER BY tick").fetchall()
    assert [count for _, count in rows] == [1] * 50  # every tick once, none twice
    assert sorted(made) == sorted(r[0] for r in conn.execute("SELECT id FROM jobs").fetchall())
    [last] = conn.execute("SELECT last_tick FROM schedules").fetchone() or [None]
    assert last == rows[-1][0]
