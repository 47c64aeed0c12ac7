"""Does a long history of finished jobs cost the queue anything?

The figures for history at scale come from here. Two schemas of one database
hold the same live part of a queue: 1,000 pending, 100 running (50 of them
with an expired lease), 100 failed, and 3,600 jobs done within the last hour
(one a second). One of them also holds --history done jobs finished evenly
over the 30 days before that hour, loaded first, so that ids follow time as
in a queue that ran. Every figure is taken on both sides in the same round
(calls alternate between them, the first side changing each call), the
figures in an order that rotates each round; each ratio, with history over
without, is taken within a round. Each figure prints as `median unit (min
.. max)` over the rounds, each ratio with its target and whether the median
meets it.

The figures for history at scale (target: each ratio <= 1.2):

- claim: the worker's claim of 10 due jobs, in a transaction rolled back:
  the claim statement alone on a connection held open, and the worker's
  exchange (`claims.exchange`, claiming only) on the drain's connection;
- drain: --drain no-op jobs claimed 10 at a time and reported done through
  `claims.exchange` on one connection, as bench/pgqctl_adapter.py's
  WorkerPath sends it, in jobs/s of the exchanges' time, the sides taking
  turns exchange by exchange (ratio: time with over time without); the
  drained jobs are deleted and the tables vacuumed afterwards, untimed;
- `stats`, `list --since 1h`, `list --since 1h --kind rare` (a kind with
  no job: fewer matches than a page), `list --status done` (its first
  page), `check` and `metrics` (the text a scrape gets): each the command
  run in this process through pgqctl's entry point, as a user gets it
  (connecting, the queries and the output included; the interpreter's
  start-up not);
- purge: after the rounds, `purge --older-than D --pause 0` of one day of
  the history (the oldest, a thirtieth of it), once a round, the table
  vacuumed between, untimed: seconds and rows (target: under 1 s);
- the size of `jobs` on each side (pg_relation_size, pg_indexes_size,
  pg_total_relation_size, and each index), after loading and again after
  the purges.

Then, as before, the operator calls on a connection held open, one execution
per statement as in one CLI invocation (target: each ratio <= 2): `leases`,
`reap --dry-run`, `reap` (of the 50 expired leases, put back untimed before
each call), `requeue --dry-run --failed`, `list --status failed`, `stats`.

With --in-history, the --history done jobs are where the workers move them
(`worker --archive-after`): in jobs_history, a partition per UTC day, jobs
holding only the live part and the last hour; and each purge's cutoff is a
UTC midnight, so that it drops one day's partition whole (the first may be
part of a day).

Where the time goes: after the rounds, on the history's side, the plans the
server ran for `list --since 1h` (and with `--kind rare`), `list --status
done` and one purge batch (rolled back) go to stderr, from auto_explain with
timing and buffers (left out with --no-explain, or when the server cannot
load auto_explain).

    python bench/history_bench.py [--dsn DSN] [--history 1000000] [--in-history]
        [--rounds 5] [--calls 20] [--command-calls 5] [--drain 5000] [--no-explain]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL in a temp
data directory of its own, stopped at the end. It creates and drops a
database of its own. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pgqctl_adapter
import throwaway_db
from psycopg import sql
from report import say, summary
from shared_sql import HISTORY_SPREAD, LIVE_SET, REEXPIRE

from pgqctl import admin, cli, db, leases, migrate
from pgqctl.errors import EXIT_CHECK

EXPIRED = 50
CLAIM = """
SELECT id FROM jobs
WHERE status = 'pending' AND run_at <= now()
ORDER BY priority DESC, run_at, id
LIMIT 10
FOR UPDATE SKIP LOCKED
"""
SIDES = {"without": "hist_empty", "with": "hist_full"}  # label: schema
HISTORY_DAYS = 30
# The history ends an hour before the load, so that `list --since 1h`
# matches the same live jobs on both sides and the ratio shows only what
# the older rows cost it.
HISTORY_END = dt.timedelta(hours=1)
RECENT = 3_600  # done within the last hour, on both sides
SLOTS = 10
# Due before the live set's pending jobs (priority 0), so a drain claims
# only its own jobs.
DRAIN_JOBS = """
INSERT INTO jobs (queue, kind, payload, priority)
SELECT 'q' || i %% 3, 'noop', '{"argv": ["true"]}', 1 FROM generate_series(1, %(n)s) AS i
"""
SIZES = """
SELECT pg_relation_size(c.oid), pg_indexes_size(c.oid), pg_total_relation_size(c.oid)
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = 'jobs'
"""
INDEX_SIZES = """
SELECT i.relname, pg_relation_size(i.oid)
FROM pg_index AS x
JOIN pg_class AS i ON i.oid = x.indexrelid
JOIN pg_class AS c ON c.oid = x.indrelid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = 'jobs'
ORDER BY pg_relation_size(i.oid) DESC, i.relname
"""
# The user's commands, run in-process; `check` exits 3 when a threshold is
# breached (the live set's failed jobs and expired leases may be), which is
# an answer, not an error.
COMMANDS: dict[str, tuple[str, ...]] = {
    "pgqctl stats": ("stats",),
    "pgqctl list --since 1h": ("list", "--since", "1h"),
    # A filter that matches less than a page: the list looks through
    # everything older for more, unless something bounds it.
    "pgqctl list --since 1h --kind rare": ("list", "--since", "1h", "--kind", "rare"),
    "pgqctl list --status done": ("list", "--status", "done"),
    "pgqctl check": ("check",),
    "pgqctl metrics": ("metrics",),
}
AT_SCALE = 1.2  # the target of the figures for history at scale
OPERATOR = 2.0  # the target of the operator calls on an open connection


@dataclass
class Side:
    """One schema: a connection held open for the library calls, the drain's
    worker path, and the jobs whose leases a reap takes."""

    label: str
    schema: str
    conn: db.QueueConnection
    worker: pgqctl_adapter.WorkerPath
    expired: list[int]


@dataclass(frozen=True)
class Figure:
    name: str
    target: float
    calls: int
    op: Callable[[Side], Any]
    setup: Callable[[Side], Any] | None = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="server to create the bench database in")
    parser.add_argument("--history", type=int, default=1_000_000, help="done rows to add")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--calls", type=int, default=20, help="calls per round of each library call"
    )
    parser.add_argument(
        "--command-calls", type=int, default=5, help="calls per round of each command"
    )
    parser.add_argument("--drain", type=int, default=5_000, help="jobs per drain")
    parser.add_argument(
        "--in-history",
        action="store_true",
        help="the history in jobs_history (as the workers move it), not in jobs",
    )
    parser.add_argument(
        "--no-explain", action="store_true", help="leave out the plans printed on stderr"
    )
    args = parser.parse_args()
    # Whole claims only: a drain must not reach the live set's pending jobs.
    args.drain = max(SLOTS, -(-args.drain // SLOTS) * SLOTS)
    if args.history < HISTORY_DAYS:
        parser.error(f"--history needs at least {HISTORY_DAYS} rows (one a day)")
    admin_dsn = args.dsn or os.environ.get("PGQCTL_TEST_DSN")
    with throwaway_db.server(admin_dsn) as server_dsn, throwaway_db.database(server_dsn) as dsn:
        bench(dsn, args)


def bench(dsn: str, args: argparse.Namespace) -> None:
    history: int = args.history
    loaded_at = load(dsn, history, in_history=args.in_history)
    sides = {label: open_side(dsn, label, schema) for label, schema in SIDES.items()}
    figures = figures_of(dsn, args.calls, args.command_calls)
    sizes_before = {
        label: table_sizes(sides["with"].conn, side.schema) for label, side in sides.items()
    }

    per_round: dict[str, dict[str, list[float]]] = {
        f.name: {label: [] for label in SIDES} for f in figures
    }
    drains: dict[str, list[float]] = {label: [] for label in SIDES}
    for round_no in range(args.rounds):
        shift = round_no % len(figures)
        for figure in figures[shift:] + figures[:shift]:
            for label, seconds in time_figure(figure, sides).items():
                per_round[figure.name][label].append(seconds)
        for label, seconds in drain(sides, args.drain, round_no).items():
            drains[label].append(seconds)
        say(f"round {round_no + 1} of {args.rounds} done")

    if not args.no_explain:
        explain(sides["with"], loaded_at)
    purges = purge_days(dsn, sides["with"], loaded_at, args.rounds, args.in_history)
    sizes_after = table_sizes(sides["with"].conn, sides["with"].schema)
    for side in sides.values():
        side.worker.conn.close()
        side.conn.close()

    with_label = f"{history:,} done" + (" in jobs_history" if args.in_history else "")
    print(
        f"# {args.rounds} rounds; per round, the median of {args.calls} calls of each "
        f"library call and {args.command_calls} of each command; history: {history:,} done "
        f"jobs over {HISTORY_DAYS} days; both sides: 1,000 pending, 100 running, 100 failed, "
        f"{RECENT:,} done in the last hour; ratio = with / without history"
    )
    print("# the figures for history at scale")
    for figure in figures:
        if figure.target == AT_SCALE:
            print_figure(figure, per_round[figure.name], with_label)
        if figure.name == "claim (exchange, rolled back)":
            print_drain(drains, args.drain, with_label)
    print_purges(purges, history)
    print_sizes(sizes_before, sizes_after, with_label, len(purges))
    print("# the operator calls on a connection held open")
    for figure in figures:
        if figure.target == OPERATOR:
            print_figure(figure, per_round[figure.name], with_label)


# ------------------------------------------------------------------ set-up


# The history as the workers' move leaves it: the same rows as
# HISTORY_SPREAD's, written straight into jobs_history (ids from jobs'
# sequence, so that they follow time and stay unique across both).
HISTORY_DAYS_MADE = """
SELECT pgqctl_history_add_days((now() AT TIME ZONE 'UTC')::date - %(days)s,
                               (now() AT TIME ZONE 'UTC')::date)
"""
HISTORY_SPREAD_MOVED = """
INSERT INTO jobs_history (id, queue, kind, payload, status, priority, attempts, max_attempts,
                          run_at, created_at, claimed_at, finished_at, handbacks)
SELECT nextval(pg_get_serial_sequence('jobs', 'id')), 'q' || i %% 3, 'bench',
       '{"argv": ["true"]}', 'done', 0, 1, 3,
       t - interval '2 seconds', t - interval '2 seconds', t - interval '1 second', t, 0
FROM (
    SELECT i,
           now() - %(end)s::interval
           - (%(n)s::bigint - i) * (%(span)s::interval / %(n)s::bigint) AS t
    FROM generate_series(1, %(n)s::bigint) AS i
) AS finished
"""


def load(dsn: str, history: int, *, in_history: bool = False) -> dt.datetime:
    """Both schemas, migrated; the history (moved into jobs_history with
    `in_history`), then the live part on both sides.

    Returns the server's time the history was placed against."""
    for schema in SIDES.values():
        with db.connect(dsn, schema="public") as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        with db.connect(dsn, schema=schema) as conn:
            migrate.apply(conn, schema)
    with db.connect(dsn, schema=SIDES["with"]) as conn:
        started = time.perf_counter()
        with conn.transaction():
            row = conn.execute("SELECT now()").fetchone()
            assert row is not None
            loaded_at: dt.datetime = row[0]
            if in_history:
                conn.execute(HISTORY_DAYS_MADE, {"days": HISTORY_DAYS + 1})
            conn.execute(
                HISTORY_SPREAD_MOVED if in_history else HISTORY_SPREAD,
                {
                    "n": history,
                    "span": dt.timedelta(days=HISTORY_DAYS),
                    "end": HISTORY_END,
                },
            )
        inserted = time.perf_counter() - started
        where = "jobs_history" if in_history else "jobs"
        say(f"inserted {history:,} done rows into {where} in {inserted:.1f} s")
        if in_history:
            conn.execute(
                sql.SQL("VACUUM ANALYZE {}.jobs_history").format(sql.Identifier(SIDES["with"]))
            )
    for schema in SIDES.values():
        with db.connect(dsn, schema=schema) as conn, conn.transaction():
            conn.execute(
                HISTORY_SPREAD,
                {"n": RECENT, "span": dt.timedelta(hours=1), "end": dt.timedelta(0)},
            )
            conn.execute(LIVE_SET)
    for schema in SIDES.values():
        with db.connect(dsn, schema=schema) as conn:
            started = time.perf_counter()
            vacuum(conn, schema, analyze=True)
            say(f"VACUUM ANALYZE of {schema}.jobs: {time.perf_counter() - started:.1f} s")
    return loaded_at


def open_side(dsn: str, label: str, schema: str) -> Side:
    conn = db.connect(dsn, schema=schema)
    # One execution per statement, as in one CLI invocation: never prepared.
    conn.prepare_threshold = None
    expired = [lease.job.id for lease in leases.leases(conn, expired_only=True)]
    assert len(expired) == EXPIRED, expired
    worker = pgqctl_adapter.WorkerPath(dsn, slots=SLOTS, schema=schema)
    return Side(label, schema, conn, worker, expired)


def figures_of(dsn: str, calls: int, command_calls: int) -> list[Figure]:
    def claim(side: Side) -> Any:
        with side.conn.transaction(force_rollback=True):
            return side.conn.execute(CLAIM).fetchall()

    def claim_exchange(side: Side) -> Any:
        conn = side.worker.conn
        with conn.transaction(force_rollback=True):
            return pgqctl_adapter.claim_once(conn, SLOTS)

    def command(args: tuple[str, ...]) -> Callable[[Side], Any]:
        return lambda side: pgqctl_in_process(*args, "--dsn", dsn, "--schema", side.schema)

    return [
        Figure("claim (10, rolled back)", AT_SCALE, calls, claim),
        Figure("claim (exchange, rolled back)", AT_SCALE, calls, claim_exchange),
        *(Figure(name, AT_SCALE, command_calls, command(a)) for name, a in COMMANDS.items()),
        Figure("leases", OPERATOR, calls, lambda s: leases.leases(s.conn)),
        Figure("reap --dry-run", OPERATOR, calls, lambda s: leases.reap_preview(s.conn)),
        Figure(
            f"reap ({EXPIRED} expired)",
            OPERATOR,
            calls,
            lambda s: leases.reap(s.conn),
            # Only the reap itself is timed; putting the leases back is not.
            setup=lambda s: in_schema(s.conn, REEXPIRE, {"ids": s.expired}),
        ),
        Figure(
            "requeue --dry-run --failed",
            OPERATOR,
            calls,
            lambda s: admin.requeue(s.conn, admin.Selection(), dry_run=True),
        ),
        Figure(
            "list --status failed",
            OPERATOR,
            calls,
            lambda s: admin.list_jobs(s.conn, status="failed"),
        ),
        Figure("stats", OPERATOR, calls, lambda s: admin.stats(s.conn)),
    ]


def in_schema(conn: db.QueueConnection, statement: str, params: Any = None) -> Any:
    """A statement in the side's schema: pgqctl's connections name it in
    each transaction, and a statement outside one has none."""
    with conn.transaction():
        return conn.execute(statement, params)


def vacuum(conn: db.QueueConnection, schema: str, *, analyze: bool = False) -> None:
    """VACUUM (ANALYZE) of the schema's jobs, which runs outside a transaction."""
    verb = sql.SQL("VACUUM ANALYZE" if analyze else "VACUUM")
    conn.execute(sql.SQL("{} {}.jobs").format(verb, sql.Identifier(schema)))


def pgqctl_in_process(*args: str) -> str:
    """A pgqctl command run in this process (no interpreter start-up); its stdout."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    if code not in (0, EXIT_CHECK) or (code == EXIT_CHECK and args[0] != "check"):
        raise RuntimeError(f"pgqctl {args[0]} exited {code}: {err.getvalue().strip()[-300:]}")
    return out.getvalue()


# ------------------------------------------------------------------ timing


def time_figure(figure: Figure, sides: dict[str, Side]) -> dict[str, float]:
    """The median of the figure's calls on each side, the sides alternating."""
    times: dict[str, list[float]] = {label: [] for label in sides}
    for i in range(figure.calls):
        labels = list(sides) if i % 2 == 0 else list(reversed(sides))
        for label in labels:
            side = sides[label]
            if figure.setup:
                figure.setup(side)
            started = time.perf_counter()
            figure.op(side)
            times[label].append(time.perf_counter() - started)
    return {label: statistics.median(values) for label, values in times.items()}


def measure(operations: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, float]:
    """Each operation's median over rounds of the median of its calls (for
    bench/monitor_bench.py, which times one side, then the other)."""
    per_round: dict[str, list[float]] = {name: [] for name in operations}
    for _ in range(rounds):
        for name, op in operations.items():
            times = []
            for _ in range(calls):
                setup = getattr(op, "setup", None)
                if setup:
                    setup()
                started = time.perf_counter()
                op()
                times.append(time.perf_counter() - started)
            per_round[name].append(statistics.median(times))
    return {name: statistics.median(values) for name, values in per_round.items()}


def drain(sides: dict[str, Side], jobs: int, round_no: int) -> dict[str, float]:
    """Each side's seconds to claim and complete `jobs` jobs (a multiple of
    SLOTS) through the worker's exchange, as pgqctl_adapter.WorkerPath sends
    it: the time of its exchanges, summed, the sides taking turns exchange by
    exchange (so both meet the same moments of a noisy machine). Then the
    drained jobs go and the tables are vacuumed, untimed, so every round
    meets the same tables."""
    floors = {}
    for label, side in sides.items():
        row = in_schema(side.conn, "SELECT coalesce(max(id), 0) FROM jobs").fetchone()
        assert row is not None
        floors[label] = int(row[0])
        in_schema(side.conn, DRAIN_JOBS, {"n": jobs})
    held: dict[str, list[Any]] = {label: [] for label in sides}
    spent = dict.fromkeys(sides, 0.0)
    order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
    for step in range(jobs // SLOTS):
        for label in order if step % 2 == 0 else reversed(order):
            path = sides[label].worker
            started = time.perf_counter()
            held[label] = path.exchange(held[label])
            spent[label] += time.perf_counter() - started
            if len(held[label]) != SLOTS or min(job.id for job in held[label]) <= floors[label]:
                raise RuntimeError(f"exchange {step + 1} of the drain claimed {held[label]}")
    for label in order:
        # The last batch reported, claiming none: the live set's jobs stay pending.
        path = sides[label].worker
        started = time.perf_counter()
        changed = path.claims.exchange(
            path.conn,
            done=[job.held for job in held[label]],
            lease=path.LEASE_S,
            worker=path.worker,
        )
        spent[label] += time.perf_counter() - started
        if len(changed.done) != SLOTS:
            raise RuntimeError("a fenced report matched fewer jobs than it reported")
    for label, side in sides.items():
        gone = in_schema(
            side.conn,
            "DELETE FROM jobs WHERE id > %(floor)s AND kind = 'noop' AND status = 'done'",
            {"floor": floors[label]},
        ).rowcount
        if gone != jobs:
            raise RuntimeError(f"{gone:,} drained jobs done in {side.schema}, not {jobs:,}")
        vacuum(side.conn, side.schema)
    return spent


# ------------------------------------------------------------------- purge


def purge_days(
    dsn: str, side: Side, loaded_at: dt.datetime, rounds: int, in_history: bool = False
) -> list[tuple[float, int]]:
    """`purge --older-than` of the history's oldest day, then the next, once a
    round: (seconds, rows) of each, the table vacuumed between, untimed.
    `in_history`: up to each UTC midnight in turn, a partition a purge."""
    done = []
    for day in range(1, min(rounds, HISTORY_DAYS - 1) + 1):
        older = older_than(side.conn, loaded_at, day, midnight=in_history)
        started = time.perf_counter()
        out = pgqctl_in_process(
            "purge",
            "--older-than",
            f"{older:.3f}s",
            "--pause",
            "0",
            "--json",
            "--dsn",
            dsn,
            "--schema",
            side.schema,
        )
        elapsed = time.perf_counter() - started
        result = json.loads(out)
        deleted = int(result["deleted"])
        for gone in result.get("dropped_days", []):
            deleted += int(gone["estimated_rows"] or 0)
        done.append((elapsed, deleted))
        say(f"purge of day {day}: {deleted:,} rows in {elapsed:.2f} s")
        vacuum(side.conn, side.schema, analyze=True)
    return done


def older_than(
    conn: db.QueueConnection, loaded_at: dt.datetime, day: int, *, midnight: bool = False
) -> float:
    """The --older-than, in seconds, that leaves out the history's first `day`
    days, whenever it runs: the history began HISTORY_DAYS days before its end.
    With `midnight`: up to the day-th UTC midnight after it began."""
    row = conn.execute("SELECT now(), now() - %(at)s::timestamptz", {"at": loaded_at}).fetchone()
    assert row is not None
    now: dt.datetime = row[0]
    since_load: dt.timedelta = row[1]
    kept = dt.timedelta(days=HISTORY_DAYS - day)
    if not midnight:
        return (since_load + HISTORY_END + kept).total_seconds()
    began = loaded_at - HISTORY_END - dt.timedelta(days=HISTORY_DAYS)
    first = dt.datetime.combine(
        began.astimezone(dt.timezone.utc).date(), dt.time(), dt.timezone.utc
    )
    return (now - (first + dt.timedelta(days=day))).total_seconds()


# ------------------------------------------------------------------- sizes


def table_sizes(conn: db.QueueConnection, schema: str) -> dict[str, int]:
    row = conn.execute(SIZES, {"schema": schema}).fetchone()
    assert row is not None
    found = {"heap": int(row[0]), "indexes": int(row[1]), "total": int(row[2])}
    for name, size in conn.execute(INDEX_SIZES, {"schema": schema}).fetchall():
        found[name] = int(size)
    return found


# ----------------------------------------------------------------- explain


def explain(side: Side, loaded_at: dt.datetime) -> None:
    """The plans the server ran for a few calls, from auto_explain, on stderr."""
    conn = side.conn
    plans: list[str] = []
    conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    try:
        conn.execute("LOAD 'auto_explain'")
    except Exception as exc:
        say(f"no plans: auto_explain cannot be loaded ({exc})")
        return
    for setting in (
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_analyze = on",
        "SET auto_explain.log_buffers = on",
        "SET client_min_messages = log",
    ):
        conn.execute(setting)
    plan = admin.purge_plan(conn, ["done"], older_than(conn, loaded_at, 1))
    calls: dict[str, Callable[[], Any]] = {
        "list --since 1h": lambda: list_first_page(conn, admin.JobFilter(since=3600.0)),
        "list --since 1h --kind rare": lambda: list_first_page(
            conn, admin.JobFilter(kinds=("rare",), since=3600.0)
        ),
        "list --status done": lambda: list_first_page(conn, admin.JobFilter(statuses=("done",))),
        "one purge batch of day 1 (rolled back)": lambda: purge_batch_rolled_back(conn, plan),
    }
    for name, call in calls.items():
        plans.clear()
        started = time.perf_counter()
        call()
        elapsed = time.perf_counter() - started
        say(f"plans of {name} ({elapsed * 1000:.1f} ms with the plans' timing):")
        for text in plans:
            if " jobs" in text:
                for line in plan_lines(text):
                    print(f"#   {line}", file=sys.stderr)
    conn.execute("SET client_min_messages = notice")
    conn.execute("SET auto_explain.log_min_duration = -1")


def plan_lines(text: str) -> list[str]:
    """auto_explain's message with the query's text cut to its first line."""
    lines = text.splitlines()
    plan = next((i for i, line in enumerate(lines) if "(cost=" in line), len(lines))
    return [*lines[:2], "...", *lines[plan:]]


def list_first_page(conn: db.QueueConnection, found: admin.JobFilter) -> None:
    """What `list` asks for its first page: 50 jobs, then the count if they filled it."""
    if len(admin.select_jobs(conn, found, limit=50)) == 50:
        admin.count_jobs(conn, found)


def purge_batch_rolled_back(conn: db.QueueConnection, plan: admin.PurgePlan) -> None:
    with conn.transaction(force_rollback=True):
        admin.purge_batch(conn, plan, 10_000)


# ------------------------------------------------------------------- print


def ratio_line(name: str, ratios: list[float], target: float) -> str:
    met = "met" if statistics.median(ratios) <= target else "missed"
    return f"ratio {name}: {summary(ratios, 'x', digits=2)}  [target <= {target:g}: {met}]"


def print_figure(figure: Figure, rounds: dict[str, list[float]], with_label: str) -> None:
    before = [s * 1000 for s in rounds["without"]]
    after = [s * 1000 for s in rounds["with"]]
    print(f"{figure.name} (no history): {summary(before, 'ms')}")
    print(f"{figure.name} ({with_label}): {summary(after, 'ms')}")
    ratios = [a / b for a, b in zip(after, before, strict=True)]
    print(ratio_line(figure.name, ratios, figure.target))


def print_drain(drains: dict[str, list[float]], jobs: int, with_label: str) -> None:
    name = f"drain ({jobs:,} jobs, exchanges of {SLOTS})"
    print(f"{name} (no history): {summary([jobs / t for t in drains['without']], 'jobs/s')}")
    print(f"{name} ({with_label}): {summary([jobs / t for t in drains['with']], 'jobs/s')}")
    ratios = [a / b for a, b in zip(drains["with"], drains["without"], strict=True)]
    print(ratio_line(f"{name} (time)", ratios, AT_SCALE))


def print_purges(purges: list[tuple[float, int]], history: int) -> None:
    seconds = [p[0] for p in purges]
    rows = [float(p[1]) for p in purges]
    name = f"purge --older-than, one day of {HISTORY_DAYS} (--pause 0)"
    met = "met" if statistics.median(seconds) < 1 else "missed"
    print(f"{name}: {summary(seconds, 's')}  [target < 1 s: {met}]")
    print(f"{name}: {summary(rows, 'rows', digits=0)} of {history:,}")
    print(f"{name}: {summary([r / s for s, r in purges], 'rows/s', digits=0)}")


def print_sizes(
    before: dict[str, dict[str, int]], after: dict[str, int], with_label: str, days: int
) -> None:
    for part in before["with"]:
        empty = before["without"].get(part)
        line = f"size jobs {part}:" if part in ("heap", "indexes", "total") else f"size {part}:"
        line += f" {mb(empty)} (no history), {mb(before['with'][part])} ({with_label})"
        line += f", {mb(after.get(part))} after purging {days} day{'s' * (days != 1)}"
        print(line)


def mb(size: int | None) -> str:
    return "-" if size is None else f"{size / 1e6:,.1f} MB"


if __name__ == "__main__":
    main()
