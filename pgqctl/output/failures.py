"""`pgqctl failures`: one row per kind and cause."""

from __future__ import annotations

from pgqctl.failures import FIELDS, Failures
from pgqctl.output.formats import emit_rows, is_human
from pgqctl.text import plural

COLUMNS = ["jobs", "kind", "cause", "first_seen", "last_seen", "example_id"]


def emit_failures(found: Failures, fmt: str) -> list[str]:
    """The causes as a table (the example's text as the cause, for people)
    or records; the messages for stderr: how many failed jobs, in how many
    causes, and how many causes were left out."""
    records = [c.as_record() for c in found.causes]
    if is_human(fmt):
        emit_rows([{**r, "cause": r["example"]} for r in records], COLUMNS, fmt)
    else:
        emit_rows(records, FIELDS, fmt)
    shown = sum(c.jobs for c in found.causes)
    said = [f"{plural(found.total, 'failed job')}"]
    if shown < found.total:
        said.append(f"{found.total - shown:,} of them in causes left out; --limit to see more")
    return said
