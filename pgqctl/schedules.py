"""Schedules: cron expressions and intervals whose ticks the workers enqueue.

The library behind `pgqctl schedule ...`; its SQL is
sql/queries/schedules.sql. A schedule is a row of `schedules`; the workers
read them and enqueue each due tick as a job (pgqctl/ticks.py), one job per
(schedule, tick) whatever the number of workers (see
sql/migrations/0008_schedules.sql). Cron expressions and time zones, with
their daylight-saving changes, are the `cronsim` library's and the standard
library's `zoneinfo`: nothing here parses a cron expression itself.

Every change notifies the workers (channel pgqctl_schedules), which read
the schedules again at once. Nothing here prints or exits.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import psycopg
from psycopg.rows import dict_row

from pgqctl.db import atomic
from pgqctl.durations import parse_duration
from pgqctl.errors import BadInput
from pgqctl.intake.fields import make_job
from pgqctl.limits import check_name
from pgqctl.sql import query
from pgqctl.text import cut

Connection = psycopg.Connection[Any]
UTC = dt.timezone.utc

# A tick not enqueued within this long after its time is missed: `schedule
# list` and `check --schedules` say so, and a worker's --catch-up decides
# what becomes of it. A tick due more recently is on time, and every such
# tick is enqueued, so a worker that checks a little late loses none.
MISSED_GRACE = 5.0
# `--catch-up all` enqueues at most this many of a schedule's missed ticks
# (the most recent): a fleet down for a day must not bring back 86,400 jobs
# of a schedule every second.
CATCH_UP_MAX = 100
CATCH_UP = ("latest", "none", "all")
SOURCES = ("cli", "file")
# What a tick does while the job of the schedule's previous tick is still
# pending or running: enqueue nothing (skip, the default of new schedules:
# a slow job does not pile up a backlog of itself) or enqueue it anyway.
OVERLAP = ("skip", "allow")

# The keys of a [schedules.NAME] table of a sync file.
FILE_KEYS = (
    "cron",
    "every",
    "timezone",
    "kind",
    "payload",
    "queue",
    "priority",
    "max_attempts",
    "paused",
    "overlap",
)
# A schedule's fields in machine output, in order.
FIELDS = (
    "name",
    "cron",
    "every_seconds",
    "timezone",
    "kind",
    "payload",
    "queue",
    "priority",
    "max_attempts",
    "paused",
    "overlap",
    "source",
    "sync_source",
    "created_at",
    "updated_at",
    "next_tick",
    "last_tick",
    "last_job_id",
    "last_job_status",
    "missed_since",
    "skipped_ticks",
    "last_skipped_tick",
)


# --- timing -----------------------------------------------------------------------


def _zone(name: str) -> dt.tzinfo:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        reason = exc.args[0] if exc.args else "unknown"
        raise BadInput(
            f"time zone {name!r} is not known ({reason}): give an IANA name such as "
            "Europe/Paris or America/New_York, or UTC"
        ) from None


@dataclass(frozen=True)
class Timing:
    """When a schedule ticks: a cron expression in a time zone, or every
    `every` seconds (at multiples of it since the epoch, in UTC)."""

    cron: str | None = None
    every: int | None = None
    timezone: str = "UTC"

    @classmethod
    def make(cls, cron: str | None, every: object, timezone: str | None) -> Timing:
        """A checked timing; BadInput with the library's reason when it is not one."""
        if (cron is None) == (every is None):
            raise BadInput("give a schedule --cron 'EXPR' or --every DURATION (one of them)")
        if every is not None:
            if timezone not in (None, "UTC"):
                raise BadInput(
                    "--timezone is for --cron: an --every interval ticks at the same "
                    "moments in every zone"
                )
            return cls(every=_every_seconds(every))
        assert cron is not None
        timing = cls(cron=" ".join(cron.split()), timezone=timezone or "UTC")
        timing.zone()  # a bad zone first: the expression's check uses it
        from cronsim import CronSim, CronSimError

        try:
            CronSim(timing.cron or "", dt.datetime.now(timing.zone()))
        except CronSimError as exc:
            raise BadInput(
                f"{cron!r} is not a cron expression: {exc}; give five fields (minute "
                "hour day-of-month month day-of-week), e.g. '0 3 * * *', or six with "
                "seconds first"
            ) from None
        return timing

    def zone(self) -> dt.tzinfo:
        return _zone(self.timezone)

    def describe(self) -> str:
        """`cron 0 3 * * *` or `every 30s`."""
        if self.cron is not None:
            return f"cron {self.cron}"
        return f"every {_seconds_text(self.every or 0)}"

    def ticks_back(self, until: dt.datetime, after: dt.datetime) -> Iterator[dt.datetime]:
        """The ticks t with after < t <= until, most recent first, in UTC."""
        if self.every is not None:
            step = dt.timedelta(seconds=self.every)
            tick = _EPOCH + (until - _EPOCH) // step * step
            while tick > after:
                yield tick
                tick -= step
            return
        from cronsim import CronSim

        # The library steps back from the second before `until` (a time
        # with microseconds counts itself): one microsecond later takes in
        # a tick at `until` itself.
        start = (until + dt.timedelta(microseconds=1)).astimezone(self.zone())
        for tick in CronSim(self.cron or "", start, reverse=True):
            utc = tick.astimezone(UTC)
            if utc <= after:
                return
            if utc <= until:
                yield utc

    def next_after(self, when: dt.datetime) -> dt.datetime:
        """The first tick after `when`, in UTC."""
        if self.every is not None:
            step = dt.timedelta(seconds=self.every)
            return _EPOCH + ((when - _EPOCH) // step + 1) * step
        from cronsim import CronSim

        return next(iter(CronSim(self.cron or "", when.astimezone(self.zone())))).astimezone(UTC)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


def _every_seconds(every: object) -> int:
    if isinstance(every, bool) or not isinstance(every, (str, int, float)):
        raise BadInput(f"every {every!r} is not a duration: give e.g. '30s', '5m' or '1h'")
    seconds = parse_duration(str(every), what="every")
    if seconds < 1 or seconds != int(seconds) or seconds > 2**31 - 1:
        raise BadInput(
            f"every {every!r} is not a whole number of seconds of at least 1s: "
            "workers look for due ticks once a second; give e.g. 1s, 30s, 5m"
        )
    return int(seconds)


def _seconds_text(seconds: int) -> str:
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def due_ticks(
    timing: Timing,
    after: dt.datetime,
    now: dt.datetime,
    catch_up: str = "latest",
    *,
    grace: float = MISSED_GRACE,
    bound: int = CATCH_UP_MAX,
) -> list[dt.datetime]:
    """The ticks to enqueue now of a schedule whose ticks up to `after` are
    done with, oldest first: every tick due within `grace` (on time), and of
    the missed ones before them, by `catch_up`: the latest (latest), none
    (none), or each (all); at most `bound` in all (the most recent)."""
    on_time_from = now - dt.timedelta(seconds=grace)
    ticks: list[dt.datetime] = []
    for tick in timing.ticks_back(now, after):
        if len(ticks) >= bound:
            break
        if tick <= on_time_from:  # missed
            if catch_up == "none":
                break
            ticks.append(tick)
            if catch_up == "latest":
                break
        else:
            ticks.append(tick)
    return ticks[::-1]


def missed_since(
    timing: Timing, after: dt.datetime, now: dt.datetime, *, grace: float = MISSED_GRACE
) -> dt.datetime | None:
    """The first tick after `after` when it was not enqueued within `grace`: missed."""
    first = timing.next_after(after)
    return first if first <= now - dt.timedelta(seconds=grace) else None


# --- a schedule -------------------------------------------------------------------


@dataclass(frozen=True)
class Definition:
    """What a schedule does, as `add` or a sync file gives it."""

    name: str
    timing: Timing
    kind: str
    payload: dict[str, Any] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 3
    paused: bool | None = None  # None: as it is (a new one: not paused)
    overlap: str | None = None  # None: as it is (a new one: skip)

    def params(self, source: str, sync_source: str | None = None) -> dict[str, Any]:
        return {
            "name": self.name,
            "cron": self.timing.cron,
            "every_seconds": self.timing.every,
            "timezone": self.timing.timezone,
            "kind": self.kind,
            "payload": json.dumps(self.payload),
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "paused": bool(self.paused),
            "keep_paused": self.paused is None,
            "overlap": self.overlap or "skip",
            "keep_overlap": self.overlap is None,
            "source": source,
            "sync_source": sync_source,
        }


def define(
    name: str,
    *,
    cron: str | None = None,
    every: object = None,
    timezone: str | None = None,
    kind: object,
    payload: object = None,
    queue: object = "default",
    priority: object = 0,
    max_attempts: object = 3,
    paused: bool | None = None,
    overlap: str | None = None,
) -> Definition:
    """A checked definition: the job's fields as `enqueue` checks them
    (payload included), and the timing as the cron library and zoneinfo do."""
    _check_name(name)
    timing = Timing.make(cron, every, timezone)
    if overlap is not None and overlap not in OVERLAP:
        raise BadInput(f"overlap {overlap!r} is not one of {', '.join(OVERLAP)}")
    job = make_job(kind, payload, queue=queue, priority=priority, max_attempts=max_attempts)
    return Definition(
        name,
        timing,
        job.kind,
        json.loads(job.payload),
        job.queue,
        job.priority,
        job.max_attempts,
        paused,
        overlap,
    )


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name.strip() or "\0" in name or name != name.strip():
        raise BadInput(f"{name!r} is not a schedule name: give a name such as nightly-report")
    check_name("schedule name", name)


@dataclass(frozen=True)
class Schedule:
    """A schedule as stored, with its last tick's job and what is due now."""

    name: str
    timing: Timing
    kind: str
    payload: dict[str, Any]
    queue: str
    priority: int
    max_attempts: int
    paused: bool
    overlap: str
    source: str
    sync_source: str | None  # the sync's --source that made it (None: not a sync's, or older)
    created_at: dt.datetime
    updated_at: dt.datetime
    ticks_after: dt.datetime
    last_tick: dt.datetime | None
    last_job_id: int | None
    last_job_status: str | None
    skipped_ticks: int  # ticks skipped (overlap skip) since it was made
    last_skipped_tick: dt.datetime | None
    now: dt.datetime  # the database's, when read

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Schedule:
        return cls(
            row["name"],
            Timing(row["cron"], row["every_seconds"], row["timezone"]),
            row["kind"],
            row["payload"],
            row["queue"],
            row["priority"],
            row["max_attempts"],
            row["paused"],
            row["overlap"],
            row["source"],
            row["sync_source"],
            row["created_at"],
            row["updated_at"],
            row["ticks_after"],
            row["last_tick"],
            row["last_job_id"],
            row.get("last_job_status"),
            row["skipped_ticks"],
            row["last_skipped_tick"],
            row["now"],
        )

    @property
    def after(self) -> dt.datetime:
        """Ticks up to here are done with (enqueued, or before the schedule)."""
        return max(self.ticks_after, self.last_tick or self.ticks_after)

    @property
    def next_tick(self) -> dt.datetime | None:
        """The next tick to come (None while paused)."""
        return None if self.paused else self.timing.next_after(max(self.now, self.after))

    @property
    def missed_since(self) -> dt.datetime | None:
        """The first tick not enqueued within the grace, while unpaused."""
        return None if self.paused else missed_since(self.timing, self.after, self.now)

    def definition(self) -> Definition:
        return Definition(
            self.name,
            self.timing,
            self.kind,
            self.payload,
            self.queue,
            self.priority,
            self.max_attempts,
            self.paused,
            self.overlap,
        )

    def as_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cron": self.timing.cron,
            "every_seconds": self.timing.every,
            "timezone": self.timing.timezone,
            "kind": self.kind,
            "payload": self.payload,
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "paused": self.paused,
            "overlap": self.overlap,
            "source": self.source,
            "sync_source": self.sync_source,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "next_tick": self.next_tick,
            "last_tick": self.last_tick,
            "last_job_id": self.last_job_id,
            "last_job_status": self.last_job_status,
            "missed_since": self.missed_since,
            "skipped_ticks": self.skipped_ticks,
            "last_skipped_tick": self.last_skipped_tick,
        }


def _rows(conn: Connection, name: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query(name), dict(params))
        return cur.fetchall() if cur.description else []


def _notify(conn: Connection) -> None:
    # Workers read the schedules again at once (sent at commit).
    _rows(conn, "schedules_notify", {})


def _one(conn: Connection, name: str) -> Schedule:
    rows = _rows(conn, "schedule_get", {"name": name})
    if not rows:
        raise BadInput(f"no schedule named {name!r}: `pgqctl schedule list` shows them")
    return Schedule.from_row(rows[0])


# --- commands ---------------------------------------------------------------------


def add(conn: Connection, definition: Definition) -> Schedule:
    """Store a new schedule (from the command line); BadInput if the name is taken."""
    with conn.transaction():
        rows = _rows(conn, "schedule_insert", definition.params("cli"))
        if not rows:
            raise BadInput(
                f"a schedule named {definition.name!r} exists: `pgqctl schedule remove "
                f"{definition.name}` first, or give another name"
            )
        _notify(conn)
        return _one(conn, definition.name)


def list_all(conn: Connection) -> list[Schedule]:
    """Every schedule, by name, with its last tick's job."""
    with atomic(conn):
        return [Schedule.from_row(r) for r in _rows(conn, "schedule_list", {})]


def show(conn: Connection, name: str) -> Schedule:
    with atomic(conn):
        return _one(conn, name)


def remove(conn: Connection, name: str) -> Schedule:
    """Remove a schedule; its jobs stay (and keep its name)."""
    with conn.transaction():
        found = _one(conn, name)
        _rows(conn, "schedule_delete", {"name": name})
        _notify(conn)
    return found


def set_paused(conn: Connection, name: str, paused: bool) -> tuple[Schedule, bool]:
    """Pause or resume a schedule; whether it changed. A resumed schedule
    does not catch up the ticks of its pause: it ticks from now on."""
    with conn.transaction():
        before = _one(conn, name)
        if before.paused == paused:
            return before, False
        _rows(conn, "schedule_set_paused", {"name": name, "paused": paused})
        _notify(conn)
        return _one(conn, name), True


def run_now(conn: Connection, name: str) -> int:
    """Enqueue one job of a schedule now, outside its ticks (no tick); its id."""
    with conn.transaction():
        rows = _rows(conn, "schedule_run", {"name": name})
        if not rows:
            raise BadInput(f"no schedule named {name!r}: `pgqctl schedule list` shows them")
        return int(rows[0]["id"])


def missed(conn: Connection) -> list[Schedule]:
    """The schedules whose last tick was missed (not enqueued within the grace)."""
    return [s for s in list_all(conn) if s.missed_since is not None]


# --- sync -------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One change of a sync: add, update or remove `name`; `fields` that differ."""

    action: str
    name: str
    fields: tuple[str, ...] = ()

    def as_record(self) -> dict[str, Any]:
        return {"action": self.action, "name": self.name, "fields": list(self.fields)}


def read_file(data: BinaryIO | bytes, source: str) -> list[Definition]:
    """The schedules of a sync file, checked whole; BadInput names the
    schedule and the key that is wrong."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found,no-redef]

    try:
        doc = tomllib.loads(data.decode() if isinstance(data, bytes) else data.read().decode())
    except UnicodeDecodeError:
        raise BadInput(f"{source} is not UTF-8 text: a sync file is TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{source} is not valid TOML: {exc}") from None
    unknown = [k for k in doc if k != "schedules"]
    if unknown:
        raise BadInput(
            f"{source}: unknown table {unknown[0]!r}: schedules go in [schedules.NAME] tables"
        )
    tables = doc.get("schedules", {})
    if not isinstance(tables, dict):
        raise BadInput(f"{source}: schedules must be tables, [schedules.NAME]")
    found = []
    for name, table in tables.items():
        where = f"{source}: schedule {cut(name, 40)!r}"  # cut: a name may be over the limit
        if not isinstance(table, dict):
            raise BadInput(f"{where}: give it as a table, [schedules.{name}]")
        for key in table:
            if key not in FILE_KEYS:
                raise BadInput(f"{where}: unknown key {key!r}; keys: {', '.join(FILE_KEYS)}")
        for key, kind in (
            ("cron", str),
            ("timezone", str),
            ("paused", bool),
            ("payload", dict),
            ("overlap", str),
        ):
            if key in table and not isinstance(table[key], kind):
                raise BadInput(f"{where}: key {key!r} must be {_toml_type(kind)}")
        if "kind" not in table:
            raise BadInput(f"{where}: key 'kind' is missing: what kind of job it enqueues")
        try:
            found.append(
                define(
                    name,
                    cron=table.get("cron"),
                    every=table.get("every"),
                    timezone=table.get("timezone"),
                    kind=table["kind"],
                    payload=table.get("payload"),
                    queue=table.get("queue", "default"),
                    priority=table.get("priority", 0),
                    max_attempts=table.get("max_attempts", 3),
                    paused=table.get("paused"),
                    overlap=table.get("overlap"),
                )
            )
        except BadInput as exc:
            raise BadInput(f"{where}: {_key_of(exc, table)}{exc}") from None
    return found


def _toml_type(kind: type) -> str:
    return {str: "a string", bool: "true or false", dict: "an inline table"}[kind]


def _key_of(exc: BadInput, table: Mapping[str, Any]) -> str:
    """`key 'X': `, for the key of the file a definition's error is about."""
    text = str(exc)
    if "give a schedule --cron" in text:
        return "keys 'cron' and 'every': " if "cron" in table else "key 'cron' or 'every': "
    for key, sign in (
        ("timezone", "time zone"),
        ("timezone", "--timezone"),
        ("cron", "cron expression"),
        ("payload", "payload"),
    ):
        if sign in text:
            return f"key {key!r}: "
    for key in ("every", "kind", "queue", "priority", "max_attempts", "overlap"):
        if text.startswith(key):
            return f"key {key!r}: "
    return ""


def _differs(old: Definition, new: Definition) -> tuple[str, ...]:
    changed = []
    if old.timing != new.timing:
        changed.append("timing")
    for name in ("kind", "payload", "queue", "priority", "max_attempts"):
        if getattr(old, name) != getattr(new, name):
            changed.append(name)
    if new.paused is not None and bool(old.paused) != new.paused:
        changed.append("paused")
    if new.overlap is not None and old.overlap != new.overlap:
        changed.append("overlap")
    return tuple(changed)


def source_of(file_name: str | None, source: str | None) -> str:
    """The source a sync keeps its schedules under: `source` when given,
    else the file's name without its directories (`file_name` None: stdin,
    which has none); BadInput for an empty name or one `add` would refuse."""
    if source is None:
        if file_name is None:
            raise BadInput("give --source NAME to sync from stdin: the schedules are kept under it")
        source = os.path.basename(file_name)
    if not source.strip():
        raise BadInput("--source is empty: give the name of the file's team or purpose")
    check_name("source", source)
    return source


@dataclass(frozen=True)
class Synced:
    """What a sync changed (or would), and the schedules an earlier sync made
    with no source that this file does not name: no sync removes them."""

    changes: list[Change]
    unowned: list[str]


def sync(
    conn: Connection,
    wanted: Sequence[Definition],
    *,
    source: str,
    dry_run: bool = False,
) -> Synced:
    """Make the schedules of `source` match `wanted`, in one transaction:
    add the new ones, update those that differ, and remove the schedules of
    `source` that it no longer names; never a schedule of another source,
    nor one made by `add`. A schedule `wanted` names that `add` made, or
    that a sync made before sources existed, becomes `source`'s; one of
    another source is BadInput (nothing changes). A `paused` or `overlap`
    the file leaves out leaves the schedule's as it is. With `dry_run`
    nothing is changed."""
    names = {d.name for d in wanted}
    with conn.transaction(force_rollback=dry_run):
        # Two syncs at once would each remove what the other adds.
        _rows(conn, "schedules_lock", {})
        stored = {
            s.name: s for s in (Schedule.from_row(r) for r in _rows(conn, "schedule_list", {}))
        }
        _refuse_others(stored, wanted, source)
        changes: list[Change] = []
        for definition in wanted:
            old = stored.get(definition.name)
            params = definition.params("file", source)
            if old is None:
                changes.append(Change("add", definition.name))
                _rows(conn, "schedule_insert", params)
                continue
            differs = _differs(old.definition(), definition)
            if old.source != "file" or old.sync_source != source:
                differs = (*differs, "source")
            if differs:
                changes.append(Change("update", definition.name, differs))
                _rows(conn, "schedule_update", {**params, "retime": "timing" in differs})
        for name, old in stored.items():
            if name not in names and old.source == "file" and old.sync_source == source:
                changes.append(Change("remove", name))
                _rows(conn, "schedule_delete", {"name": name})
        if changes:
            _notify(conn)
    unowned = [
        name
        for name, old in stored.items()
        if name not in names and old.source == "file" and old.sync_source is None
    ]
    return Synced(sorted(changes, key=lambda c: c.name), sorted(unowned))


def _refuse_others(
    stored: Mapping[str, Schedule], wanted: Sequence[Definition], source: str
) -> None:
    """BadInput when the file names a schedule that another source's sync made."""
    for definition in wanted:
        old = stored.get(definition.name)
        if old is not None and old.sync_source not in (None, source):
            raise BadInput(
                f"schedule {definition.name!r} belongs to source {old.sync_source!r}, not "
                f"{source!r}: rename it in this file, or remove it from {old.sync_source!r} "
                f"and sync that first (or sync with --source {old.sync_source!r} if this "
                "file is that source)"
            )
