"""What a statement's plan reads: EXPLAIN ANALYZE of it as a worker or a
command runs it (a cached generic plan, or a custom one as behind a
pooler), and the rows its nodes on a table read."""

from __future__ import annotations

import json
import re
from typing import Any

from psycopg import sql

PLANS = ["generic", "custom"]


def plan_of(conn: Any, text: str, params: dict[str, Any], plan: str) -> list[dict[str, Any]]:
    """EXPLAIN ANALYZE of a statement, rolled back: its top plan nodes.

    generic: PREPAREd and run under force_generic_plan, as the worker runs it;
    custom: sent unprepared with its parameters, as behind a pooler.
    """
    with conn.transaction(force_rollback=True):
        if plan == "custom":
            explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
            cur = conn.execute(explain + text, params, prepare=False)
            row = cur.fetchone()
        else:
            names: list[str] = []

            def number(match: re.Match[str]) -> str:
                if match[1] not in names:
                    names.append(match[1])
                return f"${names.index(match[1]) + 1}"

            positional = re.sub(r"%\((\w+)\)s", number, text).replace("%%", "%")
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            conn.execute(f"PREPARE probe AS {positional}")
            args = sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
            row = conn.execute(
                sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE probe ({})").format(args)
            ).fetchone()
            conn.execute("DEALLOCATE probe")
    assert row is not None
    found = row[0]
    return found if isinstance(found, list) else json.loads(found)


def rows_read(explained: list[dict[str, Any]], table: str = "jobs") -> int:
    """Rows every node on `table` produced or threw away, over all its loops."""
    total = 0

    def walk(node: dict[str, Any]) -> None:
        nonlocal total
        if node.get("Relation Name") == table:
            per_loop = (
                node.get("Actual Rows", 0)
                + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0)
            )
            total += round(per_loop * node.get("Actual Loops", 0))
        for child in node.get("Plans", []):
            walk(child)

    walk(explained[0]["Plan"])
    return total
