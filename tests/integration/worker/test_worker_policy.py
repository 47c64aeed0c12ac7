"""A worker's policy end to end: real worker processes refuse what it forbids,
run what it allows, and `enqueue --policy` refuses the same jobs up front."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import run_cli
from tests.support.jobrows import insert_jobs, job, statuses

SH = os.path.realpath("/bin/sh")


def run_worker(
    dsn: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`pgqctl worker --burst` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "pgqctl", "worker", "--dsn", dsn, "--burst", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    """The allowed directory: a script that leaves a mark, and a symlink out to /bin/sh."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    script = jobs / "mark"
    script.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/../marks"\n')
    script.chmod(0o755)
    (jobs / "escape").symlink_to(SH)
    return jobs


def marks(jobs_dir: Path) -> list[str]:
    path = jobs_dir.parent / "marks"
    return path.read_text().split() if path.exists() else []


def policy_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return str(path)


def test_an_allowlist_refuses_sh_symlinks_out_and_loader_variables_and_runs_the_rest(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path, jobs_dir: Path
) -> None:
    policy = policy_file(tmp_path, f'programs = ["{jobs_dir}/"]\n')
    mark = str(jobs_dir / "mark")
    touched = tmp_path / "touched"
    refused = insert_jobs(
        conn,
        [
            {"argv": ["sh", "-c", f"touch {touched}"]},
            {"argv": ["/bin/sh", "-c", f"touch {touched}"]},
            {"argv": [str(jobs_dir / "escape"), "-c", f"touch {touched}"]},
            {"argv": [mark, "preloaded"], "env": {"LD_PRELOAD": "/tmp/evil.so"}},
        ],
    )
    [allowed] = insert_jobs(conn, [{"argv": [mark, "ran"], "env": {"LANG": "C"}}])

    result = run_worker(dsn, "--policy", policy)

    assert result.returncode == 0, result.stderr
    assert f"heartbeat 5s, policy {policy}, database " in result.stderr
    assert not touched.exists()
    assert marks(jobs_dir) == ["ran"]
    assert job(conn, allowed)["status"] == "done"
    rows = [job(conn, job_id) for job_id in refused]
    # Permanent: failed at the first attempt, never retried.
    assert [(r["status"], r["attempts"]) for r in rows] == [("failed", 1)] * 4
    errors = [r["last_error"] for r in rows]
    assert errors == [
        f"program sh ({SH}) is not on the policy's allowlist (programs): "
        f"allow it with --allow-program {SH} or programs in {policy}",
        f"program /bin/sh ({SH}) is not on the policy's allowlist (programs): "
        f"allow it with --allow-program {SH} or programs in {policy}",
        f"program {jobs_dir / 'escape'} ({SH}) is not on the policy's allowlist (programs): "
        f"allow it with --allow-program {SH} or programs in {policy}",
        '"env" sets LD_PRELOAD, which changes what programs load or run, and the policy '
        f"does not allow it (allow_env): allow it with --allow-env LD_PRELOAD or allow_env "
        f"in {policy}",
    ]
    for job_id in refused:
        assert f"job {job_id} failed permanently (it can never run): " in result.stderr


def test_options_alone_make_a_policy_and_allow_what_they_name(
    conn: psycopg.Connection[Any], dsn: str, jobs_dir: Path
) -> None:
    mark = str(jobs_dir / "mark")
    insert_jobs(
        conn,
        [
            {"argv": [mark, "preloaded"], "env": {"LD_PRELOAD": ""}},
            {"argv": ["sh", "-c", f"{mark} via-sh"]},
        ],
    )
    # PGQCTL_ALLOW_PROGRAM holds paths as PATH does, separated by ":".
    allow = {"PGQCTL_ALLOW_PROGRAM": f"{jobs_dir}:/bin/sh"}
    result = run_worker(dsn, "--allow-env", "LD_PRELOAD", env=allow)
    assert result.returncode == 0, result.stderr
    assert statuses(conn) == {"done": 2}, result.stderr
    assert "policy from the worker's options" in result.stderr
    assert sorted(marks(jobs_dir)) == ["preloaded", "via-sh"]


def test_a_handlers_only_worker_refuses_kinds_without_a_handler(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path, jobs_dir: Path
) -> None:
    [unhandled] = insert_jobs(conn, [{"argv": [str(jobs_dir / "mark"), "argv"]}], kind="report")
    [handled] = insert_jobs(conn, [{"to": "someone"}], kind="mail")
    policy = policy_file(
        tmp_path,
        f'handlers_only = true\nprograms = ["{jobs_dir}"]\n'
        f'[handlers]\nmail = "{jobs_dir / "mark"} mailed"\n',
    )
    result = run_worker(dsn, "--policy", policy)
    assert result.returncode == 0, result.stderr
    assert job(conn, handled)["status"] == "done"
    row = job(conn, unhandled)
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert row["last_error"] == (
        "kind 'report' has no handler, and the policy runs only kinds that have one "
        f"(handlers_only): give the worker --handler report=COMMAND or [handlers] in {policy}"
    )
    assert marks(jobs_dir) == ["mailed"]


@pytest.mark.parametrize(
    ("policy_text", "args", "message"),
    [
        ("programs = [", (), "is not valid TOML: "),
        ("programs = ['/usr/bin']\nallow_shell = true\n", (), "unknown key 'allow_shell'"),
        ("programs = ['/usr/lib/jobs']\n", ("--handler", "mail=sh -c x"), "the handler of kind"),
        ("handlers_only = true\n", (), "handlers_only), and the worker has none"),
        ("[handlers]\nmail = 'true'\n", ("--handler", "mail=true"), "and a --handler: keep one"),
    ],
)
def test_a_bad_policy_stops_the_worker_at_start_with_exit_2_and_one_line(
    conn: psycopg.Connection[Any],
    dsn: str,
    tmp_path: Path,
    policy_text: str,
    args: tuple[str, ...],
    message: str,
) -> None:
    insert_jobs(conn, [{"argv": ["true"]}])
    result = run_worker(dsn, "--policy", policy_file(tmp_path, policy_text), *args)
    assert result.returncode == 2
    assert result.stderr.startswith("pgqctl: error: ")
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert statuses(conn) == {"pending": 1}


def test_enqueue_with_a_policy_refuses_what_workers_would_with_exit_2_and_writes_nothing(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path, jobs_dir: Path
) -> None:
    policy = policy_file(
        tmp_path,
        f'programs = ["{jobs_dir}"]\n[handlers]\nmail = "{jobs_dir / "mark"}"\n',
    )
    mark = str(jobs_dir / "mark")

    result = run_cli("enqueue", "--dsn", dsn, "--policy", policy, "x", '{"argv": ["sh"]}')
    assert result.exit_code == 2
    assert result.stderr == (
        f"pgqctl: error: refused by the policy in {policy}: program sh ({SH}) is not on the "
        f"policy's allowlist (programs): allow it with --allow-program {SH} or programs in "
        f"{policy}\n"
    )

    lines = [
        {"kind": "x", "payload": {"argv": [mark]}},
        {"kind": "mail", "payload": {"to": "someone"}},
        {"kind": "x", "payload": {"argv": [mark], "env": {"LD_PRELOAD": "x.so"}}},
    ]
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = run_cli("enqueue", "--dsn", dsn, "--policy", policy, "--file", str(jobs_file))
    assert result.exit_code == 2
    assert result.stderr.startswith(
        f"pgqctl: error: {jobs_file}, line 3: refused by the policy in {policy}: "
        '"env" sets LD_PRELOAD'
    )
    assert result.stderr.endswith("; nothing was enqueued\n")
    assert statuses(conn) == {}

    # What the policy allows goes in, from the argument or a file.
    result = run_cli(
        "enqueue", "--dsn", dsn, "--policy", policy, "x", json.dumps(lines[0]["payload"])
    )
    assert result.exit_code == 0, result.stderr
    jobs_file.write_text("".join(json.dumps(line) + "\n" for line in lines[:2]))
    result = run_cli("enqueue", "--dsn", dsn, "--policy", policy, "--file", str(jobs_file))
    assert result.exit_code == 0, result.stderr
    assert statuses(conn) == {"pending": 3}


def test_enqueue_refuses_a_malformed_policy_before_connecting(tmp_path: Path) -> None:
    policy = policy_file(tmp_path, 'programs = "/usr/bin"\n')
    result = run_cli(
        "enqueue", "--dsn", "postgresql://nobody@127.0.0.1:1/none", "--policy", policy, "x"
    )
    assert result.exit_code == 2
    assert result.stderr == (
        f"pgqctl: error: policy file {policy}: programs must be an array of strings, "
        'e.g. ["/usr/local/lib/jobs/"]\n'
    )


def test_schedule_add_and_sync_with_a_policy_refuse_what_workers_would(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path, jobs_dir: Path
) -> None:
    policy = policy_file(tmp_path, f'programs = ["{jobs_dir}"]\n')
    mark = str(jobs_dir / "mark")
    result = run_cli(
        "schedule", "add", "nightly", "--every", "1h", "--dsn", dsn, "--policy", policy,
        "report", '{"argv": ["/bin/sh", "-c", "id"]}',
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr == (
        f"pgqctl: error: refused by the policy in {policy}: program /bin/sh ({SH}) is not on "
        f"the policy's allowlist (programs): allow it with --allow-program {SH} or programs "
        f"in {policy}\n"
    )

    schedules = tmp_path / "schedules.toml"
    schedules.write_text(
        f'[schedules.fine]\nevery = "1h"\nkind = "report"\npayload = {{argv = ["{mark}"]}}\n'
        '[schedules.preload]\nevery = "1h"\nkind = "report"\n'
        f'payload = {{argv = ["{mark}"], env = {{LD_PRELOAD = "x.so"}}}}\n'
    )
    result = run_cli("schedule", "sync", str(schedules), "--dsn", dsn, "--policy", policy)
    assert result.exit_code == 2
    assert result.stderr.startswith(
        f"pgqctl: error: {schedules}: schedule 'preload': refused by the policy in {policy}: "
        '"env" sets LD_PRELOAD'
    )
    assert conn.execute("SELECT count(*) FROM schedules").fetchone() == (0,)

    schedules.write_text(schedules.read_text().split("[schedules.preload]")[0])
    result = run_cli("schedule", "sync", str(schedules), "--dsn", dsn, "--policy", policy)
    assert result.exit_code == 0, result.stderr
    assert conn.execute("SELECT name FROM schedules").fetchall() == [("fine",)]
