"""`pgqctl enqueue` as a user runs it, against a real PostgreSQL: one job, a
file of JSON lines, limits, and the payloads a worker would refuse.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqctl.intake import loading
from tests.conftest import random_name, run_cli
from tests.support.jobrows import enqueue_file_unheard, snapshot
from tests.unit.test_enqueue_rows import COMMON, GENERAL

# --- payloads checked where they are written -------------------------------------------

TYPO = '"timout"'
HINT = 'did you mean "timeout" instead of "timout"?'


def count_in(dsn: str) -> int:
    with psycopg.connect(dsn) as c:
        return count(c)


def rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, queue, kind, payload, priority, max_attempts, status, attempts,"
        " run_at - created_at FROM jobs ORDER BY id"
    ).fetchall()


def count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobs").fetchone()
    assert row is not None
    return int(row[0])


def write_lines(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def pgqctl(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgqctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,
    )


def run_on_terminal(*args: str, stdout: bool) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run pgqctl with stdout (else stderr) on a terminal; return what the terminal got."""
    controller, terminal = pty.openpty()
    streams: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    streams["stdout" if stdout else "stderr"] = terminal
    command = [sys.executable, "-m", "pgqctl", *args]
    try:
        with subprocess.Popen(command, text=True, **streams) as proc:
            os.close(terminal)
            shown = _read_all(controller)  # drained as it comes: a full terminal would block
            out, err = proc.communicate(timeout=60)
    finally:
        os.close(controller)
    return subprocess.CompletedProcess(command, proc.returncode, out, err), shown


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the other side is closed
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode()


# ------------------------------------------------------------------- limits

LONG = random_name(3000)
BIG = {"blob": "x" * 2_000_000}  # 2,000,011 bytes as JSON


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_enqueue_whose_ids_cannot_be_written_says_the_job_is_in_all_the_same(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "pgqctl", "enqueue", "ping", "--dsn", dsn],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    [(job_id,)] = conn.execute("SELECT id FROM jobs").fetchall()
    assert result.returncode == 1
    assert result.stderr == (
        f"pgqctl: error: enqueued 1 job (id {job_id}) but could not write its id: "
        "No space left on device; it is in the queue: do not enqueue it again\n"
    )


def test_a_bad_run_at_names_the_option_once(dsn: str, conn: psycopg.Connection[Any]) -> None:
    result = run_cli("enqueue", "k", "--run-at", "tomorrow", "--dsn", dsn)
    assert result.exit_code == 2
    assert result.stderr.count("--run-at") == 1
    assert "'tomorrow' is not an ISO 8601 time" in result.stderr
    assert snapshot(conn) == []


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('{"argv": ["sleep", "9"], "timout": 5}', HINT),
        ('{"argv": "ls -l"}', '"argv" must be an array of strings'),
        ('{"argv": []}', '"argv" is empty'),
        ('{"argv": ["ls", 3]}', '"argv"[1] is a number, not a string'),
        ('{"argv": ["ls"], "env": {"N": 1}}', '"env"["N"] is a number, not a string'),
        ('{"shell": ""}', '"shell" must be a command line'),
        ('{"argv": ["ls"], "timeout": "soon"}', '"timeout" must be a positive duration'),
        # Finite, but past what the worker's timers hold: it crashed the worker.
        ('{"argv": ["sleep", "1"], "timeout": 1e308}', "at most 100 years, e.g."),
        ('{"argv": ["sleep", "1"], "timeout": 3153600001}', "at most 100 years, e.g."),
    ],
)
def test_enqueue_refuses_a_payload_the_worker_would_refuse(
    dsn: str, conn: psycopg.Connection[Any], payload: str, message: str
) -> None:
    result = run_cli("enqueue", "k", payload, "--dsn", dsn)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr and "payload cannot run" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert snapshot(conn) == []


def test_enqueue_file_refuses_such_a_payload_on_any_line_and_inserts_nothing(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    good = [json.dumps({"kind": "k", "payload": {"argv": ["echo", str(i)]}}) for i in range(400)]
    handler = [json.dumps({"kind": "receipt", "payload": {"order_id": i}}) for i in range(5)]
    bad = json.dumps({"kind": "k", "payload": {"argv": ["sleep", "1"], "timout": 5}})
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join([*good[:2], *handler, bad, *good[2:]]) + "\n")
    result = run_cli("enqueue", "--file", str(path), "--dsn", dsn)
    assert result.exit_code == 2, result.stderr
    assert f"line 8: payload cannot run: unknown payload key {TYPO} ({HINT})" in result.stderr
    assert result.stderr.rstrip().endswith("nothing was enqueued")
    assert snapshot(conn) == []
    # Payloads that are a handler's (neither argv nor shell) stay accepted.
    path.write_text("\n".join([*good, *handler]) + "\n")
    ok = run_cli("enqueue", "--file", str(path), "--json", "--dsn", dsn)
    assert ok.exit_code == 0, ok.stderr
    assert len(json.loads(ok.stdout)) == 405


@pytest.mark.parametrize("many", [3, 300])  # an INSERT, and COPY
def test_the_python_api_refuses_such_a_payload_before_sending_anything(
    dsn: str, conn: psycopg.Connection[Any], many: int
) -> None:
    import pgqctl
    from pgqctl.errors import BadInput

    with psycopg.connect(dsn) as app:
        with pytest.raises(BadInput, match=HINT):
            pgqctl.enqueue(app, "k", {"argv": ["ls"], "timout": 1})
        jobs: list[dict[str, Any]] = [{"kind": "k", "payload": {"argv": ["ls"]}}] * many
        jobs[-1] = {"kind": "k", "payload": {"argv": ["ls"], "env": {"N": 1}}}
        with pytest.raises(ValueError, match=rf'jobs\[{many - 1}\]: .*"env"\["N"\]'):
            pgqctl.enqueue_many(app, jobs)
        assert pgqctl.enqueue(app, "receipt", {"order_id": 1}) > 0  # still usable
        app.commit()
    assert conn.execute("SELECT kind FROM jobs").fetchall() == [("receipt",)]


# ------------------------------------------------------------------ one job


def test_one_job_with_every_option(dsn: str, conn: psycopg.Connection[Any]) -> None:
    result = run_cli(
        "enqueue", "resize", '{"image": 7}', "--queue", "images", "--priority", "5",
        "--delay", "90s", "--max-attempts", "7", "--dsn", dsn,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    (row,) = rows(conn)
    assert result.stdout == f"{row[0]}\n"
    assert row[1:] == (
        "images", "resize", {"image": 7}, 5, 7, "pending", 0, dt.timedelta(seconds=90),
    )  # fmt: skip


def test_one_job_defaults_and_json_output(dsn: str, conn: psycopg.Connection[Any]) -> None:
    result = run_cli("enqueue", "hello", "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    (row,) = rows(conn)
    assert json.loads(result.stdout) == [{"id": row[0]}]
    assert row[1:] == ("default", "hello", {}, 0, 3, "pending", 0, dt.timedelta(0))


def test_run_at_with_offset(dsn: str, conn: psycopg.Connection[Any]) -> None:
    result = run_cli("enqueue", "k", "--run-at", "2030-01-02T03:04:05+02:00", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    (run_at,) = conn.execute("SELECT run_at FROM jobs").fetchone() or ()
    assert run_at == dt.datetime(2030, 1, 2, 1, 4, 5, tzinfo=dt.timezone.utc)


def test_naive_run_at_is_the_local_time(dsn: str, conn: psycopg.Connection[Any]) -> None:
    if not Path("/usr/share/zoneinfo/Asia/Tokyo").exists():
        pytest.skip("no time zone database")
    env = {**os.environ, "TZ": "Asia/Tokyo"}
    done = pgqctl("enqueue", "k", "--run-at", "2030-01-02T09:00:00", "--dsn", dsn, env=env)
    assert done.returncode == 0, done.stderr
    (run_at,) = conn.execute("SELECT run_at FROM jobs").fetchone() or ()
    assert run_at == dt.datetime(2030, 1, 2, 0, 0, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize(
    "args, message",
    [
        (("k", '{"a": 1,'), "payload is not valid JSON: Expecting property name enclosed in "
         "double quotes at line 1 column 9"),
        (("k", "[1, 2]"), "payload must be a JSON object"),
        (("k", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"), "nested too deeply"),
        (("k", '"text"'), "payload must be a JSON object"),
        (("k", "--delay", "soon"), "Invalid value for '--delay'"),
        (("k", "--delay", "-5"), "Invalid value for '--delay'"),
        (("k", "--run-at", "next tuesday"), "Invalid value for '--run-at'"),
        (("k", "--delay", "5m", "--run-at", "2030-01-01T00:00:00Z"), "--delay or --run-at"),
        (("k", "--max-attempts", "0"), "Invalid value for '--max-attempts'"),
        (("k", "--priority", "99999999999"), "priority must be from"),
        (("",), "kind must not be empty"),
        ((), "missing KIND"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_and_inserts_nothing(
    module_dsn: str, args: tuple[str, ...], message: str
) -> None:
    result = run_cli("enqueue", *args, "--dsn", module_dsn)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert result.stdout == ""
    assert count_in(module_dsn) == 0


def test_unmigrated_database_says_to_migrate(empty_dsn: str) -> None:
    result = run_cli("enqueue", "k", "--dsn", empty_dsn)
    assert result.exit_code == 1
    assert "run `pgqctl migrate`" in result.stderr


# --------------------------------------------------------------------- bulk


def test_bulk_loads_1000_lines_and_prints_their_ids_in_order(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    path = write_lines(
        tmp_path / "jobs.jsonl", [{"kind": "n", "payload": {"i": i}} for i in range(1000)]
    )
    result = run_cli("enqueue", "--file", str(path), "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    ids = [int(line) for line in result.stdout.split()]
    in_table = conn.execute("SELECT id, (payload->>'i')::int FROM jobs ORDER BY id").fetchall()
    assert ids == [job_id for job_id, _ in in_table]
    assert [i for _, i in in_table] == list(range(1000))
    # Not a terminal: no progress bar, just the summary.
    assert result.stderr == f"pgqctl: enqueued 1000 jobs (ids {ids[0]}..{ids[-1]})\n"


def test_bulk_json_output_and_every_field(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    path = write_lines(
        tmp_path / "jobs.jsonl",
        [
            {"kind": "a", "payload": {"x": 1}, "queue": "q", "priority": 2, "max_attempts": 5},
            {"kind": "b", "delay": "2m"},
            {"kind": "c", "run_at": "2030-01-01T00:00:00Z", "payload": None},
        ],
    )
    result = run_cli("enqueue", "--file", str(path), "--format", "json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    table = rows(conn)
    assert json.loads(result.stdout) == [{"id": r[0]} for r in table]
    assert [r[1:6] for r in table] == [
        ("q", "a", {"x": 1}, 2, 5),
        ("default", "b", {}, 0, 3),
        ("default", "c", {}, 0, 3),
    ]
    assert table[1][8] == dt.timedelta(minutes=2)
    run_at = conn.execute("SELECT run_at FROM jobs WHERE kind = 'c'").fetchone()
    assert run_at == (dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc),)


def test_options_fill_what_lines_leave_out(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    path = write_lines(
        tmp_path / "jobs.jsonl",
        [{"kind": "a"}, {"kind": "b", "queue": "own", "run_at": "2030-01-01T00:00:00Z"}],
    )
    result = run_cli(
        "enqueue", "--file", str(path), "--queue", "bulk", "--priority", "4", "--delay", "1h",
        "--dsn", dsn,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    table = rows(conn)
    assert [(r[1], r[2], r[4]) for r in table] == [("bulk", "a", 4), ("own", "b", 4)]
    assert table[0][8] == dt.timedelta(hours=1)
    assert table[1][8] > dt.timedelta(days=365)


@pytest.mark.parametrize("chunk", [10_000, 100])  # all before the first COPY; mid-load
def test_bad_line_500_of_1000_exits_2_naming_it_and_inserts_nothing(
    dsn: str,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chunk: int,
) -> None:
    monkeypatch.setattr(loading, "CHUNK_JOBS", chunk)
    lines = [json.dumps({"kind": "n", "payload": {"i": i}}) for i in range(1000)]
    lines[499] = '{"kind": "n", "payload": {"i": 499}'
    path = tmp_path / "jobs.jsonl"
    result, heard = enqueue_file_unheard(dsn, path, lines)
    assert heard == []
    assert result.exit_code == 2
    assert result.stderr == (
        f"pgqctl: error: {path}, line 500: invalid JSON: Expecting ',' delimiter at column 36; "
        "nothing was enqueued\n"
    )
    assert result.stdout == ""
    assert count(conn) == 0


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"kind": "n", "prio": 1}', "unknown key 'prio'; known keys: kind, payload, queue"),
        ('{"payload": {}}', 'missing "kind"'),
        ('{"kind": "n", "payload": [1]}', "payload must be a JSON object, not an array"),
        ('{"kind": "n", "priority": "high"}', "priority must be an integer, not a string"),
        ('{"kind": "n", "delay": "soon"}', "delay 'soon' is not a duration"),
        ('{"kind": "n", "run_at": "2030-13-01"}', "run_at '2030-13-01' is not an ISO 8601 time"),
        ('{"kind": "n", "max_attempts": 0}', "max_attempts must be from 1 to"),
        ('"just text"', "expected an object"),
        ('{"kind": "n", "payload": {"x": 1e400}}', "payload cannot be stored as JSON"),
        ('{"kind": "n", "payload": {"x": "a\\u0000"}}', "payload contains a NUL character"),
    ],
)
def test_bad_line_says_what_is_wrong(
    module_dsn: str, tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"kind": "ok"}\n\n' + line + "\n")
    result = run_cli("enqueue", "--file", str(path), "--dsn", module_dsn)
    assert result.exit_code == 2
    assert f"line 3: {message}" in result.stderr
    assert count_in(module_dsn) == 0


def test_lines_are_stored_as_json_reads_them(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    lines = COMMON + GENERAL
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    result = run_cli("enqueue", "--file", str(path), "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    table = conn.execute("SELECT kind, queue, payload FROM jobs ORDER BY id").fetchall()
    expected = []
    for line in lines:
        record = json.loads(line)
        expected.append(
            (record["kind"], record.get("queue") or "default", record.get("payload") or {})
        )
    assert table == expected


def test_stdin_dash(dsn: str, conn: psycopg.Connection[Any]) -> None:
    lines = '{"kind": "a"}\n\n{"kind": "b", "payload": {"n": 2}}\n'
    result = run_cli("enqueue", "--file", "-", "--dsn", dsn, input=lines)
    assert result.exit_code == 0, result.stderr
    table = rows(conn)
    assert result.stdout.split() == [str(r[0]) for r in table]
    assert [(r[2], r[3]) for r in table] == [("a", {}), ("b", {"n": 2})]


def test_stdin_from_a_pipe_in_a_real_process(dsn: str, conn: psycopg.Connection[Any]) -> None:
    lines = "".join(json.dumps({"kind": "p", "payload": {"i": i}}) + "\n" for i in range(300))
    done = pgqctl("enqueue", "--file", "-", "--json", "--dsn", dsn, input=lines)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == 300 == count(conn)
    assert "enqueued 300 jobs" in done.stderr


def test_empty_input_enqueues_nothing(dsn: str, conn: psycopg.Connection[Any]) -> None:
    result = run_cli("enqueue", "--file", "-", "--json", "--dsn", dsn, input="\n\n")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == []
    assert "nothing to enqueue" in result.stderr
    assert count(conn) == 0


def test_missing_file_exits_2(module_dsn: str, tmp_path: Path) -> None:
    result = run_cli("enqueue", "--file", str(tmp_path / "nope.jsonl"), "--dsn", module_dsn)
    assert result.exit_code == 2
    assert "nope.jsonl' does not exist" in result.stderr


def test_kind_and_file_together_is_bad_usage(module_dsn: str, tmp_path: Path) -> None:
    path = write_lines(tmp_path / "jobs.jsonl", [{"kind": "a"}])
    result = run_cli("enqueue", "k", "--file", str(path), "--dsn", module_dsn)
    assert result.exit_code == 2
    assert "KIND [PAYLOAD] or --file, not both" in result.stderr


def test_bad_option_with_a_file_is_reported_once(module_dsn: str, tmp_path: Path) -> None:
    path = write_lines(tmp_path / "jobs.jsonl", [{"kind": "a"}])
    result = run_cli("enqueue", "--file", str(path), "--queue", "", "--dsn", module_dsn)
    assert result.exit_code == 2
    assert result.stderr == "pgqctl: error: queue must not be empty or only spaces\n"


def test_a_bulk_load_sends_one_notification(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small chunks: ten INSERT statements in the one transaction, still one wake-up.
    monkeypatch.setattr(loading, "CHUNK_JOBS", 100)
    path = write_lines(tmp_path / "jobs.jsonl", [{"kind": "n"}] * 1000)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgqctl_jobs")
        result = run_cli("enqueue", "--file", str(path), "--dsn", dsn)
        assert result.exit_code == 0, result.stderr
        received = list(listener.notifies(timeout=1.0))
    assert [(n.channel, n.payload) for n in received] == [("pgqctl_jobs", "public")]


def test_on_a_terminal_ids_are_summarised(dsn: str, tmp_path: Path) -> None:
    path = write_lines(tmp_path / "jobs.jsonl", [{"kind": "n"}] * 250)
    done, shown = run_on_terminal("enqueue", "--file", str(path), "--dsn", dsn, stdout=True)
    assert done.returncode == 0, done.stderr
    assert shown == ""
    assert "enqueued 250 jobs (ids " in done.stderr


def test_progress_bar_on_a_terminal_stderr(dsn: str, tmp_path: Path) -> None:
    path = write_lines(tmp_path / "jobs.jsonl", [{"kind": "n"}] * 250)
    done, shown = run_on_terminal("enqueue", "--file", str(path), "--dsn", dsn, stdout=False)
    assert done.returncode == 0, shown
    assert "enqueueing" in shown
    assert "enqueued 250 jobs (ids " in shown
    assert len(done.stdout.split()) == 250


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((LONG,), "kind is 3,000 characters long: the limit is 128 characters"),
        (("k", "--queue", LONG), "queue is 3,000 characters long: the limit is 128 characters"),
        (("k", "--unique-key", LONG), "unique_key is 3,000 characters long: the limit is 256"),
        (("evil\nCRITICAL fake",), r"kind holds the control character \x0a at character 5"),
        (("k", "--queue", "q\x1b[2J"), r"queue holds the control character \x1b at character 2"),
        (("k", "--queue", "q\x9b"), r"queue holds the control character \x9b at character 2"),
        # Not printable, so every worker would fail the job: refused here instead.
        (("a\u00a0b",), "kind holds the unprintable character U+00A0 (NO-BREAK SPACE) at"),
        (("k", "--queue", "\u200bq"), "queue holds the unprintable character U+200B (ZERO"),
        (("a\u2028b",), "kind holds the unprintable character U+2028 (LINE SEPARATOR) at"),
        (("\u202eevil",), "kind holds the unprintable character U+202E (RIGHT-TO-LEFT"),
        (("k", json.dumps(BIG)), "payload is 2,000,011 bytes as JSON: the limit is 1,048,576"),
        (
            ("k", '{"s": "' + "x" * 100 + '"}', "--max-payload-bytes", "100"),
            "payload is 108 bytes as JSON: the limit is 100 bytes",
        ),
    ],
)
def test_a_job_over_a_limit_exits_2_naming_the_limit_and_inserts_nothing(
    module_dsn: str, args: tuple[str, ...], message: str
) -> None:
    result = run_cli("enqueue", *args, "--dsn", module_dsn)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"pgqctl: error: {message}")
    assert len(result.stderr.splitlines()) == 1
    assert result.stdout == ""
    assert count_in(module_dsn) == 0


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"kind": LONG}, "kind is 3,000 characters long: the limit is 128 characters"),
        ({"kind": "k", "queue": LONG}, "queue is 3,000 characters long: the limit is 128"),
        (
            {"kind": "k", "unique_key": LONG},
            "unique_key is 3,000 characters long: the limit is 256",
        ),
        ({"kind": "evil\nCRITICAL fake"}, r"kind holds the control character \x0a at character 5"),
        ({"kind": "k", "queue": "q\x7f"}, r"queue holds the control character \x7f at character 2"),
        ({"kind": "a\u00a0b"}, "kind holds the unprintable character U+00A0 (NO-BREAK SPACE)"),
        ({"kind": "k", "queue": "q\u202e"}, "queue holds the unprintable character U+202E"),
        (
            {"kind": "k", "payload": BIG},
            "payload is 2,000,011 bytes as JSON: the limit is 1,048,576",
        ),
    ],
)
def test_a_line_over_a_limit_exits_2_naming_its_line_and_the_limit(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, record: dict[str, Any], message: str
) -> None:
    # Line 250 of 300: the load has begun, through COPY, when it is read.
    records: list[Any] = [{"kind": "ok", "payload": {"i": i}} for i in range(300)]
    records[249] = record
    path = tmp_path / "jobs.jsonl"
    # As a user's tool writes it: raw characters, no \u escapes.
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    result = run_cli("enqueue", "--file", str(path), "--dsn", dsn)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"pgqctl: error: {path}, line 250: {message}")
    assert result.stderr.endswith("; nothing was enqueued\n")
    assert len(result.stderr.splitlines()) == 1
    assert count(conn) == 0


def test_max_payload_bytes_raises_the_limit(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    path = write_lines(tmp_path / "jobs.jsonl", [{"kind": "big", "payload": BIG}])
    assert run_cli("enqueue", "--file", str(path), "--dsn", dsn).exit_code == 2
    raised = ("--max-payload-bytes", "4194304")
    assert run_cli("enqueue", "--file", str(path), *raised, "--dsn", dsn).exit_code == 0
    assert run_cli("enqueue", "big", json.dumps(BIG), *raised, "--dsn", dsn).exit_code == 0
    env = {"PGQCTL_MAX_PAYLOAD_BYTES": "4194304"}
    assert run_cli("enqueue", "big", json.dumps(BIG), "--dsn", dsn, env=env).exit_code == 0
    sizes = conn.execute("SELECT octet_length(payload::text) FROM jobs").fetchall()
    assert sizes == [(2_000_012,)] * 3  # jsonb's text puts a space after the colon
    zero = run_cli("enqueue", "k", "--max-payload-bytes", "0", "--dsn", dsn)
    assert zero.exit_code == 2 and "--max-payload-bytes" in zero.stderr
