"""`pgqctl schedule`: the commands, sync and the audit, against a real
PostgreSQL. Schedules cannot be wiped by accident: an empty sync file is
refused, and each file's sync touches only its own source's schedules.
"""

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

from tests.conftest import random_name, run_cli

UTC = dt.timezone.utc


def schedule_rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT * FROM schedules ORDER BY name").fetchall()


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


def make_due(conn: psycopg.Connection[Any], name: str, ago: str) -> None:
    # As if no worker had run for that long since the schedule was made.
    conn.execute(
        "UPDATE schedules SET ticks_after = now() - %s::interval WHERE name = %s", (ago, name)
    )


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


def write_named(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def names(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM schedules ORDER BY name").fetchall()]


def changes(result: Any) -> list[tuple[str, str]]:
    assert result.exit_code == 0, result.stderr
    return [(c["action"], c["name"]) for c in json.loads(result.stdout)]


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
        # What every worker would fail: a kind that is not printable, a timeout
        # past what its timers hold.
        (["--every", "1s", "a\u00a0b"], "kind holds the unprintable character U+00A0"),
        (["--every", "1s", "k", '{"argv": ["true"], "timeout": 1e308}'], "at most 100 years"),
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


@pytest.mark.parametrize("text", ["", "# schedules.toml\n# (rendered by the template)\n"])
def test_a_sync_file_with_no_schedule_is_refused_unless_allow_empty(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, text: str
) -> None:
    path = write_named(tmp_path, "schedules.toml", TEAM_A)
    assert cli(dsn, "schedule", "sync", path).exit_code == 0
    truncated = write_named(tmp_path, "schedules.toml", text)
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
    team_a = write_named(tmp_path, "team-a.toml", TEAM_A)
    team_b = write_named(tmp_path, "team-b.toml", TEAM_B)
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
    team_a = write_named(tmp_path, "team-a.toml", TEAM_A.split("[schedules.a-beat]")[0])
    assert changes(cli(dsn, "schedule", "sync", team_b, "--json")) == []
    assert changes(cli(dsn, "schedule", "sync", team_a, "--json")) == [("remove", "a-beat")]

    # A file naming another source's schedule is refused, and nothing changes.
    before = conn.execute("SELECT * FROM schedules ORDER BY name").fetchall()
    taken = write_named(
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
    team_a = write_named(tmp_path, "team-a.toml", TEAM_A)
    assert cli(dsn, "schedule", "sync", team_a).exit_code == 0
    conn.execute("UPDATE schedules SET sync_source = NULL")  # as the upgrade leaves them
    team_b = write_named(tmp_path, "team-b.toml", TEAM_B)
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
