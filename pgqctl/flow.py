"""Flow control: limits on a queue or a kind that hold for the whole fleet.

The library behind `pgqctl limit`: its SQL is sql/queries/flow.sql, and
the tables, the trigger and the claim that keep the limits are migration
0013. A limit is a row of `limits`; a worker claims with
pgqctl_claim_limited while any exists (it learns of one from a
notification, or at the latest from its next heartbeat), which passes over
the jobs of a full limit and takes a seat (concurrency, per key) and a
token (rate) for each job it claims. A job's seats are freed in the same
transaction that moves it out of running, whoever does it. Nothing here
prints or exits.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgqctl.db import atomic
from pgqctl.durations import parse_duration
from pgqctl.errors import BadInput
from pgqctl.limits import check_name
from pgqctl.sql import query

Connection = psycopg.Connection[Any]

SCOPES = ("queue", "kind")
# A rate limit's bucket holds this many tokens unless --burst says: enough
# that a worker waking a little late does not lose a token it was owed,
# few enough that a window of the period starts at most rate + 2 jobs.
DEFAULT_BURST = 2
# Above any concurrency a fleet runs; a bigger number is a typo.
MAX_SEATS = 100_000
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\S+)\s*$")
_PERIOD_WORDS = {
    **dict.fromkeys(("s", "sec", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}

LIMIT_FIELDS = (
    "scope",
    "name",
    "concurrency",
    "per_key",
    "rate",
    "period_seconds",
    "burst",
    "running",
    "seats_taken",
    "tokens",
    "held_back",
    "held_back_seconds",
    "full_keys",
)


@dataclass(frozen=True)
class Rate:
    """At most `count` starts per `period` seconds, with a bucket of `burst`."""

    count: int
    period: float
    burst: int = DEFAULT_BURST

    def text(self) -> str:
        return f"{self.count}/{_period_text(self.period)}"


def parse_rate(text: str) -> Rate:
    """`10/s`, `600/m`, `5/30s`: BadInput with an example otherwise."""
    found = _RATE.match(text)
    if not found:
        raise BadInput(f"--rate {text!r} is not N/PERIOD: give e.g. 10/s, 600/m or 5/30s")
    count = int(found.group(1))
    unit = found.group(2)
    period = _PERIOD_WORDS.get(unit)
    if period is None:
        period = parse_duration(unit, what="--rate period")
    if count < 1 or count > MAX_SEATS:
        raise BadInput(f"--rate {text!r}: the count is 1 to {MAX_SEATS:,}")
    if period <= 0:
        raise BadInput(f"--rate {text!r}: the period must be longer than 0s")
    return Rate(count, period)


def _period_text(period: float) -> str:
    for word, seconds in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if period == seconds:
            return word
    return f"{period:g}s"


@dataclass(frozen=True)
class Limit:
    """A limit as it stands: what it allows and what runs and waits under it."""

    scope: str
    name: str
    concurrency: int | None
    per_key: int | None
    rate: Rate | None
    running: int = 0
    seats_taken: int = 0
    tokens: float | None = None
    held_back: int = 0
    held_back_seconds: float | None = None
    full_keys: int = 0
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Limit:
        rate = (
            None if row["rate"] is None else Rate(row["rate"], row["period_seconds"], row["burst"])
        )
        return cls(
            row["scope"],
            row["name"],
            row["concurrency"],
            row["per_key"],
            rate,
            row["running"],
            row["seats_taken"],
            row["tokens"],
            row["held_back"],
            None if row["held_back_seconds"] is None else float(row["held_back_seconds"]),
            row["full_keys"],
            row["created_at"],
            row["updated_at"],
        )

    def rule(self) -> str:
        """What the limit allows, in the words `limit set` takes."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.per_key is not None:
            parts.append(f"per key {self.per_key}")
        if self.rate is not None:
            parts.append(f"rate {self.rate.text()} (burst {self.rate.burst})")
        return ", ".join(parts)

    def as_record(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "name": self.name,
            "concurrency": self.concurrency,
            "per_key": self.per_key,
            "rate": None if self.rate is None else self.rate.count,
            "period_seconds": None if self.rate is None else self.rate.period,
            "burst": None if self.rate is None else self.rate.burst,
            "running": self.running,
            "seats_taken": self.seats_taken,
            "tokens": None if self.tokens is None else round(self.tokens, 3),
            "held_back": self.held_back,
            "held_back_seconds": (
                None if self.held_back_seconds is None else round(self.held_back_seconds, 3)
            ),
            "full_keys": self.full_keys,
        }


@dataclass(frozen=True)
class Holding:
    """A limit that holds a pending job back now, and how: 'concurrency'
    (every seat taken), 'rate' (no token) or 'per_key' (its key's seats)."""

    scope: str
    name: str
    how: str
    limit_key: str | None
    rule: str


def set_limit(
    conn: Connection,
    scope: str,
    name: str,
    *,
    concurrency: int | None = None,
    per_key: int | None = None,
    rate: Rate | None = None,
) -> tuple[Limit, bool]:
    """Set the limit of a queue or kind to exactly this (what is not given,
    it no longer limits); the limit as it stands and whether it replaced
    one. Workers are told at commit. Jobs of it running now take its seats,
    as many as there are."""
    _check_target(scope, name)
    if concurrency is None and per_key is None and rate is None:
        raise BadInput("give --concurrency N, --per-key N or --rate N/PERIOD (or several)")
    for flag, value in (("--concurrency", concurrency), ("--per-key", per_key)):
        if value is not None and not 1 <= value <= MAX_SEATS:
            raise BadInput(
                f"{flag} {value}: give 1 to {MAX_SEATS:,}; `pgqctl limit remove` removes a limit"
            )
    if rate is not None and not 1 <= rate.burst <= MAX_SEATS:
        raise BadInput(f"--burst {rate.burst}: give 1 to {MAX_SEATS:,}")
    params = {
        "scope": scope,
        "name": name,
        "concurrency": concurrency,
        "per_key": per_key,
        "rate": None if rate is None else rate.count,
        "period": None if rate is None else rate.period,
        "burst": None if rate is None else rate.burst,
    }
    with conn.transaction():
        row = _run(conn, "flow_upsert", params)[0]
        params["id"] = row["id"]
        _run(conn, "flow_seats_fit", params)
        if concurrency is not None:
            _run(conn, "flow_seat_running", params)
        _run(conn, "flow_notify", {})
        found = [lim for lim in _limits(conn) if (lim.scope, lim.name) == (scope, name)]
    return found[0], bool(row["existed"])


def remove_limit(conn: Connection, scope: str, name: str) -> bool:
    """Remove the limit of a queue or kind; whether there was one."""
    _check_target(scope, name)
    with conn.transaction():
        removed = bool(_run(conn, "flow_delete", {"scope": scope, "name": name}))
        if removed:
            _run(conn, "flow_notify", {})
    return removed


def limits(conn: Connection) -> list[Limit]:
    """Every limit, by queue then kind, with how it stands now."""
    with atomic(conn):
        return _limits(conn)


def holding(conn: Connection, job_id: int) -> list[Holding]:
    """The limits that hold this job back now (it is pending and due)."""
    with atomic(conn):
        rows = _run(conn, "flow_holding", {"id": job_id})
    found = []
    for row in rows:
        if row["holding"] is None:
            continue
        rate = (
            None if row["rate"] is None else Rate(row["rate"], row["period_seconds"], row["burst"])
        )
        rule = Limit(row["scope"], row["name"], row["concurrency"], row["per_key"], rate).rule()
        found.append(Holding(row["scope"], row["name"], row["holding"], row["limit_key"], rule))
    return found


def free_lost_seats(conn: Connection) -> int:
    """Free the seats held for jobs that no longer run under the claim that
    took them (left by a path around the trigger: TRUNCATE, triggers
    disabled); how many. Run by every reap, in its transaction: two
    statements, so that the second judges each seat after its lock, from a
    snapshot that sees the claim that took it."""
    lost = _run(conn, "flow_seats_lost_lock", {})
    if not lost:
        return 0
    params = {
        "limit_ids": [row["limit_id"] for row in lost],
        "keys": [row["key"] for row in lost],
        "seats": [row["seat"] for row in lost],
    }
    return len(_run(conn, "flow_seats_lost_free", params))


def _limits(conn: Connection) -> list[Limit]:
    return [Limit.from_row(row) for row in _run(conn, "flow_list", {})]


def _check_target(scope: str, name: str) -> None:
    if scope not in SCOPES:
        raise BadInput("give --queue NAME or --kind NAME")
    if not name:
        raise BadInput(f"--{scope} cannot be empty: give the {scope} name jobs are enqueued with")
    check_name(scope, name)


def _run(conn: Connection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query(name), params)
        return cur.fetchall() if cur.description else []
