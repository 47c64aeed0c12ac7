"""Schedules without a database: timing (the cron library as the oracle,
daylight-saving changes included), catch-up, the sync file, the job's
environment."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from pgqctl import payload, schedules
from pgqctl.errors import BadInput
from pgqctl.schedules import Timing, due_ticks

UTC = dt.timezone.utc


def oracle(expr: str, zone: str, after: dt.datetime, until: dt.datetime) -> list[dt.datetime]:
    """The ticks in (after, until] as the library gives them, iterating forward."""
    found = []
    for tick in CronSim(expr, after.astimezone(ZoneInfo(zone))):
        utc = tick.astimezone(UTC)
        if utc > until:
            return found
        found.append(utc)
    return found


# Europe/Paris: 2026-03-29 02:00 CET jumps to 03:00 CEST; 2026-10-25 03:00
# CEST falls back to 02:00 CET. America/New_York: 2026-03-08 and 2026-11-01.
DST_CASES = [
    ("30 2 * * *", "Europe/Paris", "2026-03-27T00:00:00Z", "2026-04-01T00:00:00Z"),
    ("30 2 * * *", "Europe/Paris", "2026-10-23T00:00:00Z", "2026-10-28T00:00:00Z"),
    ("0 * * * *", "Europe/Paris", "2026-10-24T20:00:00Z", "2026-10-25T06:00:00Z"),
    ("*/20 1-3 * * *", "America/New_York", "2026-03-07T00:00:00Z", "2026-03-10T00:00:00Z"),
    ("*/20 1-3 * * *", "America/New_York", "2026-10-31T00:00:00Z", "2026-11-03T00:00:00Z"),
    ("15 1 * * SUN", "America/New_York", "2026-10-01T00:00:00Z", "2026-11-30T00:00:00Z"),
    ("0 0 * * *", "UTC", "2026-01-01T00:00:00Z", "2026-01-10T00:00:00Z"),
]


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize(("expr", "zone", "after", "until"), DST_CASES)
def test_cron_ticks_across_daylight_saving_changes_are_the_librarys(
    expr: str, zone: str, after: str, until: str
) -> None:
    timing = Timing.make(expr, None, zone)
    expected = oracle(expr, zone, at(after), at(until))
    assert expected  # the window holds ticks
    # Stepping back from `until`, as a worker does to find the due ticks.
    assert list(timing.ticks_back(at(until), at(after)))[::-1] == expected
    # What a worker enqueues catching up every tick of the window.
    assert due_ticks(timing, at(after), at(until), "all", bound=10_000) == expected
    # The next tick after each, as `schedule list` shows it.
    for previous, tick in zip([at(after), *expected], expected, strict=False):
        assert timing.next_after(previous) == tick


def test_a_time_a_spring_change_skips_runs_once_and_a_repeated_one_once() -> None:
    timing = Timing.make("30 2 * * *", None, "Europe/Paris")
    spring = list(timing.ticks_back(at("2026-03-29T12:00:00Z"), at("2026-03-28T12:00:00Z")))
    assert spring == [at("2026-03-29T01:00:00Z")]  # 03:00 CEST, just after the gap
    autumn = list(timing.ticks_back(at("2026-10-25T12:00:00Z"), at("2026-10-24T12:00:00Z")))
    assert len(autumn) == 1  # 02:30 happens twice that night: one tick


def test_every_ticks_at_multiples_of_the_interval_since_the_epoch() -> None:
    timing = Timing.make(None, "30s", None)
    ticks = list(timing.ticks_back(at("2026-12-02T10:01:10Z"), at("2026-12-02T10:00:00Z")))
    assert ticks == [at("2026-12-02T10:01:00Z"), at("2026-12-02T10:00:30Z")]
    assert timing.next_after(at("2026-12-02T10:01:00Z")) == at("2026-12-02T10:01:30Z")
    assert timing.describe() == "every 30s"
    assert Timing.make(None, "2h", None).describe() == "every 2h"


NOW = at("2026-12-02T10:00:00.400Z")
EVERY_SECOND = Timing(every=1)


def seconds_before(*offsets: int) -> list[dt.datetime]:
    base = NOW.replace(microsecond=0)
    return [base - dt.timedelta(seconds=o) for o in offsets]


def test_catch_up_latest_enqueues_the_latest_missed_tick_and_every_tick_on_time() -> None:
    after = NOW - dt.timedelta(seconds=20)  # no worker for 20 s
    # Due within the 5 s grace (on time): 4 s to 0 s ago; missed: 5 s ago and before.
    assert due_ticks(EVERY_SECOND, after, NOW, "latest") == seconds_before(5, 4, 3, 2, 1, 0)
    assert due_ticks(EVERY_SECOND, after, NOW, "none") == seconds_before(4, 3, 2, 1, 0)
    assert due_ticks(EVERY_SECOND, after, NOW, "all") == seconds_before(*range(19, -1, -1))


def test_a_worker_that_looks_late_loses_no_tick_on_time() -> None:
    after = NOW - dt.timedelta(seconds=3.2)
    for mode in schedules.CATCH_UP:
        assert due_ticks(EVERY_SECOND, after, NOW, mode) == seconds_before(2, 1, 0)


def test_catch_up_all_is_bounded_to_the_most_recent_ticks() -> None:
    after = NOW - dt.timedelta(days=1)
    ticks = due_ticks(EVERY_SECOND, after, NOW, "all")
    assert len(ticks) == schedules.CATCH_UP_MAX
    assert ticks[-1] == seconds_before(0)[0]
    assert ticks == sorted(ticks)


def test_a_tick_is_missed_once_the_grace_after_it_has_passed() -> None:
    timing = Timing(every=60)
    last = at("2026-12-02T10:00:00Z")
    assert schedules.missed_since(timing, last, at("2026-12-02T10:01:04Z")) is None
    assert schedules.missed_since(timing, last, at("2026-12-02T10:01:06Z")) == at(
        "2026-12-02T10:01:00Z"
    )


@pytest.mark.parametrize(
    ("cron", "every", "zone", "says"),
    [
        ("0 3 * *", None, None, "Wrong number of fields"),
        ("61 * * * *", None, None, "Bad minute"),
        ("0 3 * * *", None, "Mars/Olympus", "Mars/Olympus"),
        (None, "0.5s", None, "at least 1s"),
        (None, "soon", None, "not a duration"),
        (None, "30s", "Europe/Paris", "--timezone is for --cron"),
        (None, None, None, "--cron"),
        ("* * * * *", "1s", None, "one of them"),
    ],
)
def test_a_bad_timing_says_why(
    cron: str | None, every: str | None, zone: str | None, says: str
) -> None:
    with pytest.raises(BadInput, match=says):
        Timing.make(cron, every, zone)


GOOD = b"""
[schedules.nightly]
cron = "0 3 * * *"
timezone = "Europe/Paris"
kind = "report"
payload = { argv = ["./report.sh"] }
queue = "reports"
priority = 5
max_attempts = 2
paused = false

[schedules.heartbeat]
every = "30s"
kind = "ping"
"""


def test_a_sync_file_gives_each_schedule_checked() -> None:
    nightly, heartbeat = schedules.read_file(GOOD, "s.toml")
    assert nightly.name == "nightly" and nightly.timing == Timing("0 3 * * *", None, "Europe/Paris")
    assert nightly.payload == {"argv": ["./report.sh"]} and nightly.queue == "reports"
    assert (nightly.priority, nightly.max_attempts, nightly.paused) == (5, 2, False)
    assert heartbeat.timing == Timing(None, 30, "UTC") and heartbeat.paused is None
    assert heartbeat.payload == {} and heartbeat.queue == "default"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (b'[schedules.a]\ncron = "0 3 * *"\nkind = "k"', "schedule 'a': key 'cron': "),
        (
            b'[schedules.a]\ncron = "0 3 * * *"\ntimezone = "Nowhere/X"\nkind = "k"',
            "schedule 'a': key 'timezone': ",
        ),
        (b'[schedules.a]\nevery = "fast"\nkind = "k"', "schedule 'a': key 'every': every 'fast'"),
        (
            b'[schedules.a]\nevery = "1s"\nkind = "k"\nqueu = "x"',
            "schedule 'a': unknown key 'queu'",
        ),
        (b'[schedules.a]\nevery = "1s"', "schedule 'a': key 'kind' is missing"),
        (b'[schedules.a]\nevery = "1s"\nkind = "k"\npaused = "no"', "key 'paused'"),
        (
            b'[schedules.a]\nevery = "1s"\nkind = "k"\npriority = "high"',
            "schedule 'a': key 'priority': ",
        ),
        (
            b'[schedules.a]\nevery = "1s"\nkind = "k"\npayload = { argv = "ls" }',
            "schedule 'a': key 'payload': payload cannot run",
        ),
        (
            b'[schedules.a]\nevery = "1s"\nkind = "k"\noverlap = "sometimes"',
            "schedule 'a': key 'overlap': overlap 'sometimes' is not one of skip, allow",
        ),
        (b'[schedules.a]\nkind = "k"', "key 'cron' or 'every'"),
        (b"[schedules.a\n", "not valid TOML"),
        (b'[jobs.a]\nkind = "k"', "unknown table 'jobs'"),
    ],
)
def test_a_bad_sync_file_names_the_schedule_and_the_key(text: bytes, says: str) -> None:
    with pytest.raises(BadInput) as caught:
        schedules.read_file(text, "s.toml")
    assert says in str(caught.value) and str(caught.value).startswith("s.toml")


def test_a_job_of_a_schedule_gets_its_name_and_tick_and_no_other_job_does() -> None:
    tick = dt.datetime(2026, 12, 2, 3, 0, tzinfo=ZoneInfo("Europe/Paris"))
    env = payload.job_environment(
        {"PGQCTL_TICK": "stale"},
        job_id=1,
        kind="k",
        queue="q",
        attempt=1,
        extra={},
        schedule="nightly",
        tick=tick,
    )
    assert env["PGQCTL_SCHEDULE"] == "nightly" and env["PGQCTL_TICK"] == "2026-12-02T02:00:00Z"
    plain = payload.job_environment(
        {"PGQCTL_SCHEDULE": "inherited", "PGQCTL_TICK": "x"},
        job_id=1,
        kind="k",
        queue="q",
        attempt=1,
        extra={},
    )
    assert "PGQCTL_SCHEDULE" not in plain and "PGQCTL_TICK" not in plain
