"""`doctor`: the findings first, then the horizon, autovacuum and the tables."""

from __future__ import annotations

import datetime as dt
import sys
from typing import TYPE_CHECKING, Any

from pgqctl.output.formats import emit_object, resolve_format
from pgqctl.text import LINE_ESCAPES, format_seconds, human, printable, size

if TYPE_CHECKING:
    from pgqctl.doctor import Report


def _when(stamp: dt.datetime | None, count: int | None) -> str:
    at = "never" if stamp is None else stamp.isoformat(sep=" ", timespec="seconds")
    return f"{at} ({count or 0} in all)"


def _bloat_text(bloat: Any) -> str:
    if bloat.bytes is None:
        return f"bloat ? ({bloat.method}: not analyzed yet)"
    exact = "exact, pgstattuple" if bloat.method == "pgstattuple" else "estimate"
    return f"bloat {size(bloat.bytes)} ({bloat.percent:g}%, {exact})"


def doctor_lines(report: Report, *, verbose: bool = False) -> list[str]:
    """The report as text: the findings first (what to do), then the
    horizon, autovacuum and one line per table; each table's counters and
    indexes only when `verbose`."""
    lines = []
    for f in report.findings:
        lines.append(printable(f"FINDING {f.kind} ({f.subject}): {f.summary}", LINE_ESCAPES))
        lines.append(f"  do: {f.recommendation}")
        for statement in f.sql:
            lines.append(f"  {printable(statement, LINE_ESCAPES)}")
        lines.append("")
    lines.append("horizon:")
    if not report.holders:
        lines.append("  nothing holds it back")
    for h in report.holders:
        lines.append(f"  {printable(_holder_text(h), LINE_ESCAPES)}")
    av = report.autovacuum
    lines.append(
        f"autovacuum: {'on' if av['enabled'] else 'OFF'}, {av['busy_workers']} of "
        f"{av['max_workers']} workers busy, naptime {format_seconds(av['naptime_seconds'])}"
    )
    for t in report.tables:
        lines.append(
            f"{t.name}: {t.live:,} live, {t.dead:,} dead tuples; table {size(t.table_bytes)}, "
            f"indexes {size(t.index_bytes)}; {_bloat_text(t.bloat)}"
        )
        if verbose:
            lines.extend(_table_details(t))
    return lines


def _table_details(t: Any) -> list[str]:
    """A table's vacuum and analyze counters, settings and indexes (--verbose)."""
    c = t.counters
    lines = [
        f"  vacuum {_when(c['last_vacuum'], c['vacuum_count'])}, "
        f"autovacuum {_when(c['last_autovacuum'], c['autovacuum_count'])}",
        f"  analyze {_when(c['last_analyze'], c['analyze_count'])}, "
        f"autoanalyze {_when(c['last_autoanalyze'], c['autoanalyze_count'])}",
        f"  changed since: {int(c['n_mod_since_analyze'] or 0):,} rows since analyze, "
        f"{int(c['n_ins_since_vacuum'] or 0):,} inserted since vacuum; in all "
        f"{int(c['n_tup_ins'] or 0):,} inserted, {int(c['n_tup_upd'] or 0):,} updated, "
        f"{int(c['n_tup_del'] or 0):,} deleted",
    ]
    if t.options:
        lines.append("  settings: " + ", ".join(f"{k}={v}" for k, v in t.options.items()))
    for i in t.indexes:
        density = "" if i.leaf_density is None else f", leaf density {i.leaf_density:g}%"
        lines.append(f"  index {i.name}: {size(i.bytes)}, {_bloat_text(i.bloat)}{density}")
    return lines


def _holder_text(h: Any) -> str:
    f = h.figures
    kept = ""
    if h.holds_queue:
        verb = "keeps" if h.kept_is == "counted" else "keeps up to"
        kept = f": {verb} {h.kept:,} dead tuples of the queue's tables"
    elif h.kind == "slot":
        kept = ": catalog_xmin only (system catalogs), not the queue's tables"
    age = "" if h.age_seconds is None else f", {format_seconds(h.age_seconds)} old"
    xids = f"{h.xid_age:,} transactions behind" if h.xid_age is not None else "age unknown"
    if h.kind == "transaction":
        if f["state"] is None:  # another role's session, to a role that may not see it
            parts = [f"user {f['user']}", f"application {f['application']!r}", "state not seen"]
        else:
            parts = [
                f"user {f['user']}",
                f"application {f['application']!r}",
                f"client {f['client_addr'] or 'local'}",
                f"{f['state']}",
                f"transaction started {human(f['xact_start'])}{age}",
                f"query started {human(f['query_start'])}",
            ]
        return f"pid {f['pid']} (" + ", ".join(parts) + f"; {xids}){kept}"
    if h.kind == "prepared":
        return (
            f"prepared transaction {f['gid']!r} (owner {f['owner']}, database "
            f"{f['database']}, prepared {human(f['prepared'])}{age}; {xids}){kept}"
        )
    if h.kind == "slot":
        state = "active" if f["active"] else "inactive"
        return (
            f"slot {f['slot_name']!r} ({f['slot_type']}, {state}, xmin {f['xmin'] or '-'}, "
            f"catalog_xmin {f['catalog_xmin'] or '-'}; {xids}){kept}"
        )
    return (
        f"standby pid {f['pid']} (application {f['application']!r}, client "
        f"{f['client_addr']}, hot_standby_feedback xmin {f['xmin']}; {xids}){kept}"
    )


def emit_doctor(report: Report, fmt: str, *, verbose: bool = False) -> None:
    """JSON: every figure and finding; else the report as text."""
    if resolve_format(fmt) in ("json", "ndjson"):
        emit_object(report.as_json())
        return
    sys.stdout.write("\n".join(doctor_lines(report, verbose=verbose)) + "\n")
