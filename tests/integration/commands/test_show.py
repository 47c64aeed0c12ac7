"""`pgqctl show` as an operator runs it: one job, whole."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from tests.conftest import cli_json, run_cli
from tests.support.jobrows import add_jobs


def test_show_prints_every_column_with_the_payload_pretty(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    payload = json.dumps({"argv": ["convert", "a.png", "b.png"], "env": {"Q": "1"}})
    error = "exit status 1\nconvert: no such file a.png"
    (job_id,) = add_jobs(conn, payload=payload, status="failed", attempts=3, last_error=error)

    whole = cli_json(dsn, "show", str(job_id))
    columns = [r[0] for r in conn.execute("SELECT * FROM jobs LIMIT 0").description or []]
    # Every column, then what says whether payload and last_error are whole, then
    # its attempts.
    assert list(whole) == [*columns, "payload_note", "payload_cut", "last_error_cut", "history"]
    assert (whole["payload_note"], whole["payload_cut"], whole["last_error_cut"]) == (
        None,
        False,
        False,
    )
    assert whole["payload"] == json.loads(payload)
    assert whole["last_error"] == error

    table = run_cli("show", str(job_id), "--format", "plain", "--dsn", dsn)
    assert table.exit_code == 0
    assert '    "convert",' in table.stdout  # indented: pretty-printed
    assert "convert: no such file a.png" in table.stdout  # the whole error
    record, timeline = table.stdout.split("\n\n", 1)
    fields = [line.split()[0] for line in record.splitlines()[2:] if line[:1].strip()]
    assert fields == columns
    assert timeline == "attempts: none recorded\n"  # written with SQL: no worker ran it
