"""What `doctor` finds: vacuum, bloat and the xmin horizon of the queue's tables.

A queue table lives on churn: every job is inserted, updated at its claim and
again at its end, so each leaves dead row versions behind, in the table and
in the claim indexes every claim walks. Vacuum removes them only once no
transaction may still see them: the oldest snapshot anywhere (a session's
transaction, a prepared transaction, a replication slot, a standby's
feedback) is the horizon, and whatever holds it back keeps every dead tuple
made since. `diagnose` gathers the figures (statistics views and catalogs;
pgstattuple's exact figures when the extension is there and usable), names
what holds the horizon, and turns what needs doing into `Finding`s, each
with a recommendation and the SQL to act on it, built here with
psycopg.sql and never run. Its SQL is
sql/queries/doctor.sql. Nothing here prints or exits.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgqctl import history
from pgqctl.db import atomic
from pgqctl.monitor import short_duration
from pgqctl.sql import migrations, query

Connection = psycopg.Connection[Any]

# The per-table autovacuum settings `migrate` gives jobs (0007_jobs_autovacuum.sql,
# where the figures are explained): after a fixed number of rows, never a
# fraction of a table whose history only grows. A test checks the two agree.
RECOMMENDED: dict[str, str] = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "5000",
    "autovacuum_vacuum_insert_scale_factor": "0",
    "autovacuum_vacuum_insert_threshold": "10000",
    "autovacuum_analyze_scale_factor": "0",
    "autovacuum_analyze_threshold": "10000",
}
# A threshold raised further than this many times the recommended one is
# taken for changed away (a small raise may be deliberate tuning).
THRESHOLD_SLACK = 4
# Autovacuum should have come by within this many naptimes of jobs passing
# its threshold.
OVERDUE_NAPTIMES = 3
# Churn outruns autovacuum when, between two of its visits (a naptime), more
# than this many times the threshold of rows change.
CHURN_THRESHOLDS = 10

DEFAULT_MAX_HORIZON_AGE = 300.0  # seconds: `doctor --max-horizon-age 5m`

_CREATED_TABLE = re.compile(r"\bCREATE TABLE (?:IF NOT EXISTS )?(\w+)", re.IGNORECASE)


def queue_tables() -> list[str]:
    """The tables pgqctl makes in a queue's schema: every one a migration
    creates (so a table a later migration adds is examined too), and the
    bookkeeping `migrate` keeps. Which of them exist is read from the catalog."""
    names = {"jobs", "pgqctl_migrations", "pgqctl_migration_log"}
    for migration in migrations():
        names.update(_CREATED_TABLE.findall(migration.text))
    return sorted(names)


def _rows(
    conn: Connection, text: str | sql.Composed, params: Mapping[str, Any]
) -> list[dict[str, Any]]:
    with atomic(conn), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(text, dict(params))
        return cur.fetchall()


# --- the figures ------------------------------------------------------------------


@dataclass
class Bloat:
    """Space a relation takes beyond what its live rows need."""

    method: str  # "pgstattuple" (exact, read whole) or "estimate" (statistics)
    bytes: int | None  # None: cannot be told (never analyzed)
    percent: float | None
    # pgstattuple's count of dead tuples (deleted by committed transactions)
    # and free space, for a table; None for an estimate.
    dead_tuples: int | None = None
    free_bytes: int | None = None

    def as_record(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "bytes": self.bytes,
            "percent": self.percent,
            "dead_tuples": self.dead_tuples,
            "free_bytes": self.free_bytes,
        }


def _bloat(method: str, size: int, needed: int | None) -> Bloat:
    if needed is None:
        return Bloat(method, None, None)
    extra = max(size - needed, 0)
    return Bloat(method, extra, round(100.0 * extra / size, 1) if size else 0.0)


@dataclass
class IndexHealth:
    name: str
    bytes: int
    scans: int | None
    partial: bool
    bloat: Bloat
    leaf_density: float | None = None  # pgstatindex's, in percent, when it could read it

    def as_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bytes": self.bytes,
            "scans": self.scans,
            "partial": self.partial,
            "bloat": self.bloat.as_record(),
            "leaf_density": self.leaf_density,
        }


# The statistics counters of a table, as pg_stat_all_tables names them.
COUNTERS = (
    "n_live_tup",
    "n_dead_tup",
    "n_mod_since_analyze",
    "n_ins_since_vacuum",
    "n_tup_ins",
    "n_tup_upd",
    "n_tup_del",
    "n_tup_hot_upd",
    "last_vacuum",
    "last_autovacuum",
    "last_analyze",
    "last_autoanalyze",
    "vacuum_count",
    "autovacuum_count",
    "analyze_count",
    "autoanalyze_count",
)


@dataclass
class TableHealth:
    name: str
    counters: dict[str, Any]  # COUNTERS
    seconds_since_vacuum: float | None  # by hand or autovacuum; None: never
    table_bytes: int
    index_bytes: int
    options: dict[str, str]  # storage parameters (reloptions)
    bloat: Bloat
    indexes: list[IndexHealth] = field(default_factory=list)

    @property
    def dead(self) -> int:
        return int(self.counters.get("n_dead_tup") or 0)

    @property
    def live(self) -> int:
        return int(self.counters.get("n_live_tup") or 0)

    def as_record(self) -> dict[str, Any]:
        return {
            "table": self.name,
            **self.counters,
            "seconds_since_vacuum": self.seconds_since_vacuum,
            "table_bytes": self.table_bytes,
            "index_bytes": self.index_bytes,
            "options": self.options,
            "bloat": self.bloat.as_record(),
            "indexes": [i.as_record() for i in self.indexes],
        }


@dataclass
class Holder:
    """Something that holds the xmin horizon back: a session's transaction,
    a prepared transaction, a replication slot or a standby's feedback."""

    kind: str  # "transaction", "prepared", "slot", "standby"
    name: str  # "pid 4242", "prepared transaction 'gid'", "slot 's'", "standby pid 77"
    figures: dict[str, Any]
    xid_age: int | None  # transactions since its xmin (or xid)
    age_seconds: float | None  # None: a slot or a standby, whose age is not kept
    holds_queue: bool  # whether it keeps dead tuples of this database's tables
    # Dead tuples of the queue's tables it keeps from vacuum, and whether that
    # is the count ("counted") or only a bound ("at most"); see `_kept`.
    kept: int = 0
    kept_is: str = "counted"

    def as_record(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            **self.figures,
            "xid_age": self.xid_age,
            "age_seconds": self.age_seconds,
            "holds_queue_tables": self.holds_queue,
            "dead_tuples_kept": self.kept,
            "dead_tuples_kept_is": self.kept_is,
        }


@dataclass(frozen=True)
class Finding:
    """Something that needs doing, with the figures that say so, what to do
    and the SQL that does it (printed, never run)."""

    kind: str
    subject: str
    summary: str
    figures: dict[str, Any]
    recommendation: str
    sql: tuple[str, ...]

    def as_record(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "subject": self.subject,
            "summary": self.summary,
            "figures": self.figures,
            "recommendation": self.recommendation,
            "sql": list(self.sql),
        }


@dataclass
class Report:
    ts: dt.datetime
    schema: str
    tables: list[TableHealth]
    holders: list[Holder]
    autovacuum: dict[str, Any]
    max_horizon_age: float
    findings: list[Finding]
    unseen: list[str]  # what this role could not see, and why
    notes: list[str]  # how figures were made (estimates), for the reader

    @property
    def ok(self) -> bool:
        return not self.findings

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "ts": self.ts,
            "schema": self.schema,
            "max_horizon_age_seconds": self.max_horizon_age,
            "tables": [t.as_record() for t in self.tables],
            "horizon": {"holders": [h.as_record() for h in self.holders]},
            "autovacuum": self.autovacuum,
            "findings": [f.as_record() for f in self.findings],
            "unseen": self.unseen,
            "notes": self.notes,
        }


# --- gathering ----------------------------------------------------------------------


def _options(reloptions: list[str]) -> dict[str, str]:
    found = {}
    for option in reloptions:
        name, _, value = option.partition("=")
        found[name] = value
    return found


def _tables(conn: Connection, schema: str, pgstattuple: str | None) -> list[TableHealth]:
    tables: dict[str, TableHealth] = {}
    oids = []
    for row in _rows(conn, query("doctor_tables"), {"schema": schema, "names": queue_tables()}):
        size = int(row["table_bytes"])
        if pgstattuple is None:
            bloat = _bloat("estimate", size, row["needed_bytes"])
        else:
            exact = _rows(conn, _with_ext("doctor_pgstattuple", pgstattuple), {"oid": row["oid"]})
            bloat = _bloat("pgstattuple", int(exact[0]["table_len"]), int(exact[0]["tuple_len"]))
            bloat.dead_tuples = int(exact[0]["dead_tuple_count"])
            bloat.free_bytes = int(exact[0]["free_space"])
        oids.append(row["oid"])
        tables[row["name"]] = TableHealth(
            name=row["name"],
            counters={c: row[c] for c in COUNTERS},
            seconds_since_vacuum=row["seconds_since_vacuum"],
            table_bytes=size,
            index_bytes=int(row["index_bytes"]),
            options=_options(row["reloptions"]),
            bloat=bloat,
        )
    for row in _rows(conn, query("doctor_indexes"), {"schema": schema, "tables": oids}):
        size = int(row["bytes"])
        # Estimated even with pgstattuple: its leaf density counts the entries
        # of dead rows as used space, and in a claim index they are the bloat.
        bloat = _bloat("estimate", size, row["needed_bytes"])
        density = None
        if pgstattuple is not None and row["btree"]:
            exact = _rows(conn, _with_ext("doctor_pgstatindex", pgstattuple), {"oid": row["oid"]})
            found = exact[0]["avg_leaf_density"]
            density = float(found) if found is not None and found == found else None  # NaN: empty
        tables[row["table_name"]].indexes.append(
            IndexHealth(row["name"], size, row["scans"], row["partial"], bloat, density)
        )
    return list(tables.values())


def _with_ext(name: str, ext_schema: str) -> sql.Composed:
    return sql.SQL(query(name)).format(ext=sql.Identifier(ext_schema))  # type: ignore[arg-type]


def _holders(conn: Connection) -> list[Holder]:
    holders = []
    for row in _rows(conn, query("doctor_sessions"), {}):
        figures = {k: row[k] for k in row if k not in ("xid_age", "transaction_age_seconds")}
        holders.append(
            Holder(
                "transaction",
                f"pid {row['pid']}",
                figures,
                row["xid_age"],
                row["transaction_age_seconds"],
                True,
            )
        )
    for row in _rows(conn, query("doctor_prepared"), {}):
        figures = {k: row[k] for k in row if k not in ("xid_age", "age_seconds")}
        holders.append(
            Holder(
                "prepared",
                f"prepared transaction {row['gid']!r}",
                figures,
                row["xid_age"],
                row["age_seconds"],
                True,
            )
        )
    for row in _rows(conn, query("doctor_slots"), {}):
        figures = {k: row[k] for k in row}
        # A catalog_xmin holds the system catalogs only; an xmin holds every
        # table of every database (a physical slot) or of its own.
        holds = row["xmin"] is not None and bool(row["this_database"])
        age = row["xmin_age"] if row["xmin"] is not None else row["catalog_xmin_age"]
        holders.append(Holder("slot", f"slot {row['slot_name']!r}", figures, age, None, holds))
    for row in _rows(conn, query("doctor_standbys"), {}):
        figures = {k: row[k] for k in row if k != "xmin_age"}
        holders.append(
            Holder("standby", f"standby pid {row['pid']}", figures, row["xmin_age"], None, True)
        )
    holders.sort(key=lambda h: -(h.xid_age or 0))
    return holders


def _kept(holder: Holder, tables: list[TableHealth]) -> tuple[int, str]:
    """How many dead tuples of the queue's tables `holder` keeps from vacuum.

    The statistics count a table's dead tuples (n_dead_tup): those made since
    its last vacuum, plus those that vacuum found but could not remove. A
    vacuum that ran while the holder was there could remove none that died
    after the holder began; so when every table was vacuumed since the holder
    began, all its dead tuples are kept ("counted"). Otherwise some died
    before the holder began and vacuum could remove them: the count is a
    bound ("at most"), as it is for a slot or a standby, whose start is not
    known.
    """
    if not holder.holds_queue:
        return 0, "counted"
    dead = sum(t.dead for t in tables)
    began = holder.age_seconds
    vacuumed_since = began is not None and all(
        t.seconds_since_vacuum is not None and t.seconds_since_vacuum < began
        for t in tables
        if t.dead
    )
    return dead, "counted" if vacuumed_since else "at most"


def _autovacuum(conn: Connection) -> dict[str, Any]:
    row = _rows(conn, query("doctor_autovacuum"), {})[0]
    row["busy_workers"] = len(row["workers"])
    return row


def diagnose(conn: Connection, *, max_horizon_age: float = DEFAULT_MAX_HORIZON_AGE) -> Report:
    """Every figure and every finding, read in one transaction."""
    schema = getattr(conn, "schema", "public")
    unseen: list[str] = []
    notes: list[str] = []
    with atomic(conn):
        access = _rows(conn, query("doctor_access"), {})[0]
        ext = _rows(conn, query("doctor_extension"), {})
        pgstattuple = ext[0]["schema"] if ext and ext[0]["usable"] else None
        if ext and not ext[0]["usable"]:
            unseen.append(
                "exact bloat: pgstattuple needs superuser or pg_stat_scan_tables "
                "(pg_monitor has it); estimated from the statistics instead"
            )
        elif not ext:
            notes.append(
                "table bloat is estimated from the statistics (live rows times their "
                "average width); `CREATE EXTENSION pgstattuple` gives exact figures"
            )
        notes.append(
            "index bloat is estimated: entries at the last vacuum or analyze times the key's "
            "width, against the index's size (an entry of a dead row counts as bloat)"
        )
        if not access["sees_all_sessions"]:
            hidden = int(access["hidden_sessions"])
            unseen.append(
                f"the transactions of other roles' sessions ({hidden} in this database): "
                "only superuser or pg_read_all_stats sees them (GRANT pg_monitor TO "
                f"{sql.Identifier(conn.info.user).as_string(conn)})"
            )
        tables = _tables(conn, schema, pgstattuple)
        holders = _holders(conn)
        autovacuum = _autovacuum(conn)
        kept = history.state(conn)
        locks = history.read_locks(conn)
    for holder in holders:
        holder.kept, holder.kept_is = _kept(holder, tables)
    if any(h.holds_queue for h in holders):
        notes.append(
            "dead tuples kept: the statistics' dead tuples of the queue's tables (made since "
            "the last vacuum, plus those it could not remove); all of them are kept when "
            "the tables were vacuumed after the holder began, else up to that many"
        )
    findings = _findings(conn, schema, tables, holders, autovacuum, max_horizon_age)
    findings += _history_findings(kept, locks)
    return Report(
        dt.datetime.now(dt.timezone.utc),
        schema,
        tables,
        holders,
        autovacuum,
        max_horizon_age,
        findings,
        unseen,
        notes,
    )


# --- findings -------------------------------------------------------------------------


# Finished jobs left in jobs for longer than this: no worker moves them.
UNMOVED_AFTER = 86_400.0
# Reads of a job by id at once (show, logs, the web page's job pages) that
# must fit in the server's lock table with room to spare.
READERS_AT_ONCE = 8


def _history_findings(kept: history.State, locks: history.ReadLocks) -> list[Finding]:
    """Finished jobs nobody moves into the history; a history with more
    days than the server's lock table allows reads of."""
    found = []
    if locks.read_locks * READERS_AT_ONCE > locks.lock_slots:
        need = locks.max_locks_for(READERS_AT_ONCE)
        found.append(
            Finding(
                "history_locks",
                "jobs_history",
                f"the history holds {locks.days:,} days of done jobs: a read of a job by id "
                f"(show, logs, requeue) locks every day's partitions and indexes, "
                f"{locks.read_locks:,} locks at once, and {READERS_AT_ONCE} such reads would "
                f"fill the server's lock table ({locks.lock_slots:,} locks: "
                f"max_locks_per_transaction {locks.max_locks} per connection); once it is "
                'full every session\'s statements fail with "out of shared memory", the '
                "workers' too",
                {
                    "days": locks.days,
                    "read_locks": locks.read_locks,
                    "lock_slots": locks.lock_slots,
                    "max_locks_per_transaction": locks.max_locks,
                },
                "drop the days you do not keep (`pgqctl purge --older-than 90d` from cron), "
                f"or raise max_locks_per_transaction to {need} or more (a restart applies it)",
                (f"ALTER SYSTEM SET max_locks_per_transaction = {need};",),
            )
        )
    unmoved = kept.unmoved_for()
    if unmoved is not None and unmoved > UNMOVED_AFTER:
        found.append(
            Finding(
                "history_move",
                "jobs",
                f"a finished job has stayed in jobs for {_seconds(unmoved)}: no worker has "
                "moved it into the history (all run with --no-archive or an --archive-after "
                "longer than that, none runs, or they fall behind), so the table the "
                "workers claim from keeps it",
                {"oldest_finished_in_jobs_seconds": round(unmoved)},
                "run a worker without --no-archive, with an --archive-after shorter than a "
                "day: it moves the backlog a tenth of a second at a time, every second, "
                "while it runs its jobs",
                (),
            )
        )
    return found


def _seconds(s: float) -> str:
    return short_duration(s)


def _jobs(conn: Connection, schema: str) -> str:
    return sql.Identifier(schema, "jobs").as_string(conn)


def _literal(conn: Connection, value: Any) -> str:
    return sql.Literal(value).as_string(conn)


def _holder_finding(conn: Connection, h: Holder, max_age: float) -> Finding | None:
    if not h.holds_queue or h.kept <= 0:
        if h.kind == "slot" and not h.figures["active"]:
            return _slot_finding(conn, h)  # it holds WAL and catalogs forever
        return None
    kept = f"{'keeps' if h.kept_is == 'counted' else 'keeps up to'} {h.kept:,} dead tuples"
    f = h.figures
    if h.kind == "transaction":
        if h.age_seconds is None or h.age_seconds <= max_age:
            return None
        who = ", ".join(
            part
            for part in (
                f"user {f['user']}" if f["user"] else "",
                f"application {f['application']!r}" if f["application"] else "",
                f"client {f['client_addr']}" if f["client_addr"] else "",
                str(f["state"] or ""),
            )
            if part
        )
        return Finding(
            "horizon_transaction",
            h.name,
            f"pid {f['pid']} ({who}) has held a transaction open for "
            f"{_seconds(h.age_seconds)} (max {_seconds(max_age)}): it {kept} "
            "of the queue's tables from being vacuumed",
            h.as_record(),
            "end that transaction (commit or roll back in its application, or fix what "
            "leaves it idle; idle_in_transaction_session_timeout ends such sessions), or "
            "terminate the session; then vacuum",
            (f"SELECT pg_terminate_backend({_literal(conn, f['pid'])});",),
        )
    if h.kind == "prepared":
        if h.age_seconds is None or h.age_seconds <= max_age:
            return None
        return Finding(
            "horizon_prepared",
            h.name,
            f"prepared transaction {f['gid']!r} (owner {f['owner']}) was prepared "
            f"{_seconds(h.age_seconds)} ago (max {_seconds(max_age)}): it {kept} of "
            "the queue's tables from being vacuumed",
            h.as_record(),
            "have its transaction manager commit or roll it back; if it is abandoned, "
            f"roll it back in database {f['database']}",
            (f"ROLLBACK PREPARED {_literal(conn, f['gid'])};",),
        )
    if h.kind == "slot":
        if f["active"]:
            return None  # a standby's feedback: see below
        return _slot_finding(conn, h, kept)
    return None  # a standby: its age is not known on the primary (see the report)


def _slot_finding(conn: Connection, h: Holder, kept: str | None = None) -> Finding:
    f = h.figures
    if kept:
        what = f"it {kept} of the queue's tables from being vacuumed"
    elif f["xmin"]:
        what = "it holds back vacuum of every table it covers, and keeps WAL"
    else:  # logical decoding's: the system catalogs only
        what = "it holds back the system catalogs' cleanup (catalog_xmin) and keeps WAL"
    return Finding(
        "horizon_slot",
        h.name,
        f"replication slot {f['slot_name']!r} ({f['slot_type']}) is inactive with "
        f"xmin {f['xmin'] or '-'} and catalog_xmin {f['catalog_xmin'] or '-'} "
        f"({h.xid_age or 0:,} transactions old): {what}",
        h.as_record(),
        "reconnect the standby or consumer that uses it; if none will, drop it",
        (f"SELECT pg_drop_replication_slot({_literal(conn, f['slot_name'])});",),
    )


def _threshold(table: TableHealth, av: Mapping[str, Any], kind: str) -> float:
    """The effective autovacuum threshold of `table`, for `kind` vacuum or
    analyze: its own setting, else the server's."""
    base = table.options.get(f"autovacuum_{kind}_threshold", av[f"{kind}_threshold"])
    scale = table.options.get(f"autovacuum_{kind}_scale_factor", av[f"{kind}_scale_factor"])
    return float(base) + float(scale) * table.live


def _settings_changed(table: TableHealth) -> list[str]:
    changed = []
    if table.options.get("autovacuum_enabled", "true").lower() in ("false", "off", "0", "no"):
        changed.append("autovacuum_enabled=false")
    for name, value in RECOMMENDED.items():
        have = table.options.get(name)
        # A scale factor above the recommended one, or a threshold well above.
        slack = 1 if name.endswith("scale_factor") else THRESHOLD_SLACK
        if have is None:
            changed.append(f"{name} not set (the server's default applies)")
        elif float(have) > slack * float(value):
            changed.append(f"{name}={have}")
    return changed


def _findings(
    conn: Connection,
    schema: str,
    tables: list[TableHealth],
    holders: list[Holder],
    av: Mapping[str, Any],
    max_age: float,
) -> list[Finding]:
    findings, held = [], False
    for h in holders:
        found = _holder_finding(conn, h, max_age)
        if found is not None:
            findings.append(found)
            held = held or (h.holds_queue and h.kept > 0)
    jobs = next((t for t in tables if t.name == "jobs"), None)
    vacuum = f"VACUUM (VERBOSE) {_jobs(conn, schema)};"
    if not av["enabled"] or not av["track_counts"]:
        findings.append(
            Finding(
                "autovacuum_off",
                "server",
                "autovacuum is off on this server (autovacuum or track_counts): nothing "
                "vacuums the queue's tables",
                {"autovacuum": av["enabled"], "track_counts": av["track_counts"]},
                "turn autovacuum on",
                (
                    "ALTER SYSTEM SET autovacuum = on;",
                    "ALTER SYSTEM SET track_counts = on;",
                    "SELECT pg_reload_conf();",
                ),
            )
        )
    if jobs is None:
        return findings
    changed = _settings_changed(jobs)
    if changed:
        options = ", ".join(f"{k} = {v}" for k, v in {**RECOMMENDED}.items())
        if any(c.startswith("autovacuum_enabled") for c in changed):
            options = "autovacuum_enabled = true, " + options
        findings.append(
            Finding(
                "autovacuum_settings",
                "jobs",
                "jobs's autovacuum settings were changed away from a queue's: "
                + "; ".join(changed),
                {"options": jobs.options, "recommended": RECOMMENDED},
                "vacuum jobs after a fixed number of rows, not a fraction of a table whose "
                "history only grows (what `pgqctl migrate` sets)",
                (f"ALTER TABLE {_jobs(conn, schema)} SET ({options});",),
            )
        )
    threshold = _threshold(jobs, av, "vacuum")
    naptime = float(av["naptime_seconds"])
    since = jobs.seconds_since_vacuum
    figures = {
        "n_dead_tup": jobs.dead,
        "vacuum_threshold": threshold,
        "seconds_since_vacuum": since,
        "naptime_seconds": naptime,
    }
    if av["busy_workers"] >= av["max_workers"]:
        findings.append(
            Finding(
                "autovacuum_workers_busy",
                "server",
                f"all {av['max_workers']} autovacuum workers are busy "
                f"({'; '.join(av['workers'])}): jobs waits for one",
                {**figures, "workers": av["workers"], "max_workers": av["max_workers"]},
                "vacuum jobs now by hand; give autovacuum more workers (takes effect at "
                "the next restart) or make the big tables' vacuums cheaper",
                (
                    vacuum,
                    f"ALTER SYSTEM SET autovacuum_max_workers = {av['max_workers'] + 2};",
                ),
            )
        )
    if held:
        return findings  # vacuum cannot remove what the holder keeps: it is the cause
    if jobs.dead > threshold and (since is None or since > OVERDUE_NAPTIMES * naptime):
        when = "was never vacuumed" if since is None else f"was last vacuumed {_seconds(since)} ago"
        findings.append(
            Finding(
                "vacuum_overdue",
                "jobs",
                f"jobs {when} and has {jobs.dead:,} dead tuples (its threshold: "
                f"{int(threshold):,}): autovacuum does not get to it",
                figures,
                "vacuum it now; then see why autovacuum does not (workers busy on big "
                "tables, autovacuum_enabled off, a cost limit too low)",
                (vacuum,),
            )
        )
    elif since and since > 0:
        rate = (jobs.dead + int(jobs.counters.get("n_ins_since_vacuum") or 0)) / since
        if rate * naptime > CHURN_THRESHOLDS * threshold:
            findings.append(
                Finding(
                    "autovacuum_churn",
                    "jobs",
                    f"jobs changes {rate:,.0f} rows a second: {rate * naptime:,.0f} between "
                    f"two visits of autovacuum (every {_seconds(naptime)}), over "
                    f"{CHURN_THRESHOLDS} times its threshold of {int(threshold):,}",
                    {**figures, "rows_per_second": rate},
                    "have autovacuum look more often, and not throttle its vacuums of jobs",
                    (
                        "ALTER SYSTEM SET autovacuum_naptime = '15s';",
                        "SELECT pg_reload_conf();",
                        f"ALTER TABLE {_jobs(conn, schema)} SET "
                        "(autovacuum_vacuum_cost_delay = 0);",
                    ),
                )
            )
    return findings
