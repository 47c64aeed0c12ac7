"""pgqctl.payload: what a payload asks to run, and the environment it runs in."""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest

import pgqctl.payload
from pgqctl.fartime import FarTime
from pgqctl.payload import PayloadRejected, command_for_job, command_for_payload
from pgqctl.runner import Command
from tests.support.runner_helpers import child_environment, run

ENV = dict(os.environ)


def parse(payload: object, *, allow_shell: bool = False, **handlers: list[str]) -> Command:
    return command_for_job(
        payload, kind="resize", handlers=handlers, allow_shell=allow_shell, default_timeout=60.0
    )


def sh(script: str, *, timeout: float | None = None) -> Command:
    return Command(("/bin/sh", "-c", script), timeout=timeout)


# -- payloads -----------------------------------------------------------------


def test_argv_payload_runs_directly_with_the_worker_default_timeout() -> None:
    assert parse({"argv": ["convert", "a.png", "b.png"]}) == Command(
        ("convert", "a.png", "b.png"), timeout=60.0
    )


def test_optional_keys_fill_the_command() -> None:
    command = parse(
        {
            "argv": ["make"],
            "env": {"LANG": "C"},
            "cwd": "/srv/app",
            "timeout": 2,
            "stdin": "héllo",
        }
    )
    assert command == Command(
        ("make",), env={"LANG": "C"}, cwd="/srv/app", stdin="héllo".encode(), timeout=2.0
    )


def test_the_longest_timeout_a_payload_may_give_runs() -> None:
    # 100 years, the bound of every duration: far below what overflows the
    # worker's timers (a deadline of 1e308 seconds did).
    command = parse({"argv": ["true"], "timeout": "36500d"})
    assert command.timeout == 100 * 365 * 86400
    assert run(command, ENV).exit_code == 0


def test_null_optional_keys_count_as_absent() -> None:
    payload = {"argv": ["ls"], "env": None, "cwd": None, "timeout": None, "stdin": None}
    assert parse(payload) == Command(("ls",), timeout=60.0)


def test_handler_wins_over_the_payload_and_gets_it_as_compact_json() -> None:
    payload = {"argv": ["rm", "-rf", "/"], "order_id": 1, "note": "é"}
    command = parse(payload, resize=["bin/resize", "--fast"])
    assert command == Command(
        ("bin/resize", "--fast"),
        stdin='{"argv":["rm","-rf","/"],"order_id":1,"note":"é"}'.encode(),
        timeout=60.0,
    )


def test_handler_accepts_any_payload() -> None:
    assert parse([1, 2], resize=["cat"]).stdin == b"[1,2]"
    assert parse("text", resize=["cat"]).stdin == b'"text"'


def test_handler_receives_the_payload_on_stdin() -> None:
    command = parse({"order_id": 7}, resize=["cat"])
    assert run(command, ENV).output_tail == '{"order_id":7}'


def test_shell_payload_refused_without_allow_shell() -> None:
    with pytest.raises(PayloadRejected) as caught:
        parse({"shell": "echo hi | wc -c"})
    assert caught.value.reason == (
        "shell payloads need `pgqctl worker --allow-shell`; "
        'or enqueue {"argv": [...]} to run without a shell'
    )
    assert str(caught.value) == caught.value.reason


def test_shell_payload_runs_with_sh_when_allowed() -> None:
    command = parse({"shell": "echo hi | tr h H"}, allow_shell=True)
    assert command.argv == ("/bin/sh", "-c", "echo hi | tr h H")
    assert run(command, ENV).output_tail == "Hi\n"


HANDLER_HINT = "or run kind 'resize' with `pgqctl worker --handler resize=CMD`"
ARGV_EXAMPLE = '{"argv": ["ls", "-l"]}'
TIMEOUT_RULE = (
    '"timeout" must be a positive duration of at most 100 years, e.g. {"timeout": 30} '
    '(seconds) or {"timeout": "5m"} (units ms, s, m, h, d, w), got'
)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (
            ["convert"],
            'payload is an array, not an object: enqueue {"argv": [...]} or {"shell": "..."}, '
            + HANDLER_HINT,
        ),
        (
            None,
            'payload is null, not an object: enqueue {"argv": [...]} or {"shell": "..."}, '
            + HANDLER_HINT,
        ),
        (
            {"order_id": 1},
            'payload has neither "argv" nor "shell": enqueue {"argv": [...]}, ' + HANDLER_HINT,
        ),
        (
            {"argvs": ["ls"]},
            'payload has neither "argv" nor "shell" (did you mean "argv" instead of "argvs"?)',
        ),
        (
            {"argv": ["ls"], "timout": 5},
            'unknown payload key "timout" (did you mean "timeout" instead of "timout"?): '
            "allowed keys are argv or shell, env, cwd, timeout, stdin",
        ),
        (
            {"argv": ["ls"], "x": 1, "y": 2},
            'unknown payload keys "x", "y": '
            "allowed keys are argv or shell, env, cwd, timeout, stdin",
        ),
        ({"argv": ["ls"], "shell": "ls"}, 'payload has both "argv" and "shell": keep only one'),
        (
            {"argv": "ls -l"},
            '"argv" must be an array of strings, got a string: split the command into words, '
            f'e.g. {ARGV_EXAMPLE}, or use {{"shell": "..."}}',
        ),
        (
            {"argv": {"0": "ls"}},
            f'"argv" must be an array of strings, e.g. {ARGV_EXAMPLE}, got an object',
        ),
        ({"argv": []}, f'"argv" is empty: put the program first, e.g. {ARGV_EXAMPLE}'),
        ({"argv": ["sleep", 5]}, '"argv"[1] is a number, not a string: quote it, e.g. "42"'),
        ({"argv": [""]}, '"argv"[0] is an empty string: it must name the program to run'),
        (
            {"argv": ["ls", "a\0b"]},
            '"argv"[1] contains a NUL character, which no process can receive: remove it',
        ),
        (
            {"argv": ["ls"], "env": ["LANG=C"]},
            '"env" must be an object of strings, e.g. {"env": {"LANG": "C"}}, got an array',
        ),
        (
            {"argv": ["ls"], "env": {"WORKERS": 4}},
            '"env"["WORKERS"] is a number, not a string: quote it, e.g. "42"',
        ),
        (
            {"argv": ["ls"], "env": {"A=B": "1"}},
            '"env" name "A=B" is not a variable name: names are non-empty and have no "="',
        ),
        (
            {"argv": ["ls"], "cwd": 5},
            '"cwd" must be a directory path, e.g. {"cwd": "/srv/app"}, got a number',
        ),
        (
            {"argv": ["ls"], "cwd": ""},
            '"cwd" must be a directory path, e.g. {"cwd": "/srv/app"}, got an empty string',
        ),
        ({"argv": ["ls"], "timeout": 0}, f"{TIMEOUT_RULE} 0"),
        ({"argv": ["ls"], "timeout": -1.5}, f"{TIMEOUT_RULE} -1.5"),
        ({"argv": ["ls"], "timeout": "soon"}, f'{TIMEOUT_RULE} "soon"'),
        ({"argv": ["ls"], "timeout": "0s"}, f'{TIMEOUT_RULE} "0s"'),
        ({"argv": ["ls"], "timeout": "5M"}, f'{TIMEOUT_RULE} "5M"'),
        ({"argv": ["ls"], "timeout": True}, f"{TIMEOUT_RULE} true"),
        ({"argv": ["ls"], "timeout": float("inf")}, f"{TIMEOUT_RULE} Infinity"),
        # Finite, but beyond what the worker's timers hold (1e308 overflowed
        # them: the worker crashed). 1e400 in a row comes back as an int.
        ({"argv": ["ls"], "timeout": 1e308}, f"{TIMEOUT_RULE} 1e+308"),
        ({"argv": ["ls"], "timeout": 10**400}, f"{TIMEOUT_RULE} {'1' + '0' * 36}..."),
        ({"argv": ["ls"], "timeout": 100 * 365 * 86400 + 1}, f"{TIMEOUT_RULE} 3153600001"),
        ({"argv": ["ls"], "timeout": "36501d"}, f'{TIMEOUT_RULE} "36501d"'),
        (
            {"argv": ["ls"], "stdin": {"a": 1}},
            '"stdin" must be a string, got an object: encode structured data as a string, '
            "or use a handler to get the payload as JSON on stdin",
        ),
    ],
)
def test_payload_rejected_with_reason(payload: object, reason: str) -> None:
    with pytest.raises(PayloadRejected) as caught:
        parse(payload)
    assert caught.value.reason == reason


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (5, '"shell" must be a command line, e.g. {"shell": "ls | wc -l"}, got a number'),
        ("  ", '"shell" must be a command line, e.g. {"shell": "ls | wc -l"}, got a blank string'),
    ],
)
def test_bad_shell_payload_rejected_even_when_allowed(script: object, reason: str) -> None:
    with pytest.raises(PayloadRejected) as caught:
        parse({"shell": script}, allow_shell=True)
    assert caught.value.reason == reason


def test_a_payload_can_be_checked_without_a_worker() -> None:
    check = functools.partial(
        command_for_payload, kind="resize", allow_shell=True, default_timeout=None
    )
    assert check({"shell": "ls | wc -l"}) == Command(("/bin/sh", "-c", "ls | wc -l"))
    with pytest.raises(PayloadRejected) as caught:
        check({"argv": ["ls"], "timout": 5})
    assert caught.value.reason.startswith('unknown payload key "timout"')


# -- environment ----------------------------------------------------------------

SECRETS = {
    "PGQCTL_DSN": "postgresql://queue:secret@db/queue",
    "PGQCTL_CONCURRENCY": "4",
    "DATABASE_URL": "postgresql://queue:secret@db/queue",
    "PGPASSWORD": "secret",
    "PGPASSFILE": "/etc/queue.pgpass",
    "PGHOST": "db",
    "PGHOSTADDR": "10.0.0.5",
    "PGPORT": "5433",
    "PGDATABASE": "queue",
    "PGUSER": "queue",
    "PGSERVICE": "queue",
    "PGSERVICEFILE": "/etc/pg_service.conf",
    "PGSSLMODE": "verify-full",
    "PGSSLKEY": "/etc/queue.key",
    "PGGSSENCMODE": "disable",
    "PGOPTIONS": "-c search_path=queue",
}


def job_environment(base: dict[str, str], extra: dict[str, str] | None = None) -> dict[str, str]:
    return child_environment(
        base, job_id=42, kind="resize", queue="images", attempt=2, extra=extra or {}
    )


def test_child_environment_drops_database_credentials_and_keeps_the_rest() -> None:
    base = {"PATH": "/usr/bin", "HOME": "/home/app", "PGTZ": "UTC", **SECRETS}
    assert job_environment(base) == {
        "PATH": "/usr/bin",
        "HOME": "/home/app",
        "PGTZ": "UTC",
        "PGQCTL_JOB_ID": "42",
        "PGQCTL_JOB_KIND": "resize",
        "PGQCTL_JOB_QUEUE": "images",
        "PGQCTL_JOB_ATTEMPT": "2",
        "PGQCTL_JOB_CLAIM": "2",
        "PGQCTL_JOB_SCHEMA": "public",
    }


def test_job_env_applies_but_cannot_override_job_variables() -> None:
    env = job_environment(
        {"LANG": "en_US.UTF-8", "PGQCTL_JOB_ID": "1"},
        {"LANG": "C", "PGQCTL_JOB_ID": "999", "PGHOST": "reports-db"},
    )
    assert env["LANG"] == "C"
    assert env["PGQCTL_JOB_ID"] == "42"
    assert env["PGHOST"] == "reports-db"  # a job may name its own database


def test_environment_filtered_once_gives_the_same_child_environment() -> None:
    base = {"PATH": "/usr/bin", "LANG": "C", **SECRETS}
    clean = pgqctl.payload.without_credentials(base)
    assert not set(SECRETS) & set(clean)
    job = {"job_id": 7, "kind": "k", "queue": "q", "attempt": 1, "extra": {"LANG": "fr"}}
    assert pgqctl.payload.job_environment(clean, **job) == child_environment(base, **job)  # type: ignore[arg-type]


def test_a_tick_no_datetime_holds_is_given_as_postgresql_writes_it() -> None:
    # Plain SQL may write tick = 'infinity': the job runs, its tick so spelled.
    job = {"job_id": 7, "kind": "k", "queue": "q", "attempt": 1, "extra": {}}
    for text in ("infinity", "-infinity", "10001-01-01 00:00:00+00"):
        env = pgqctl.payload.job_environment({}, **job, schedule="s", tick=FarTime(text))  # type: ignore[arg-type]
        assert env["PGQCTL_TICK"] == text


def test_child_sees_job_variables_and_no_credentials() -> None:
    env = job_environment({"PATH": ENV["PATH"], **SECRETS})
    script = (
        'echo "$PGQCTL_JOB_ID $PGQCTL_JOB_KIND $PGQCTL_JOB_QUEUE $PGQCTL_JOB_ATTEMPT"; '
        "env | grep -E '^(PGQCTL_DSN|DATABASE_URL|PGPASSWORD|PGHOST|PGSSL)' || echo clean"
    )
    assert run(sh(script), env).output_tail == "42 resize images 2\nclean\n"


CHECKED = [
    {"argv": ["ls"]},
    {"argv": ["ls", ""]},
    {"argv": [""]},
    {"argv": []},
    {"argv": "ls -l"},
    {"argv": ["ls", 3]},
    {"argv": ["l\0s"]},
    {"argv": ["ls"], "env": {"A": "1"}, "cwd": "/srv", "timeout": 2.5, "stdin": "x"},
    {"argv": ["ls"], "env": {"A": 1}},
    {"argv": ["ls"], "env": {"": "1"}},
    {"argv": ["ls"], "env": {"A=B": "1"}},
    {"argv": ["ls"], "env": {"A": "\0"}},
    {"argv": ["ls"], "env": ["A"]},
    {"argv": ["ls"], "env": None, "cwd": None, "timeout": None, "stdin": None},
    {"argv": ["ls"], "cwd": ""},
    {"argv": ["ls"], "cwd": 7},
    {"argv": ["ls"], "timeout": 0},
    {"argv": ["ls"], "timeout": True},
    {"argv": ["ls"], "timeout": "5m"},
    {"argv": ["ls"], "timeout": "soon"},
    {"argv": ["ls"], "timeout": float("nan")},
    {"argv": ["ls"], "timeout": 1e308},
    {"argv": ["ls"], "timeout": 10**400},
    {"argv": ["ls"], "timeout": 100 * 365 * 86400},
    {"argv": ["ls"], "timeout": 100 * 365 * 86400 + 0.5},
    {"argv": ["ls"], "stdin": {"a": 1}},
    {"argv": ["ls"], "timout": 5},
    {"argv": ["ls"], "shell": "ls"},
    {"shell": "ls | wc -l"},
    {"shell": "  "},
    {"shell": ["ls"]},
    {"order_id": 1},
    {"argvv": ["ls"]},
]


@pytest.mark.parametrize("payload", CHECKED, ids=[repr(p) for p in CHECKED])
def test_check_payload_refuses_what_the_worker_would(payload: dict[str, object]) -> None:
    from pgqctl.payload import check_payload

    def verdict(check: Any) -> str:
        try:
            check()
        except PayloadRejected as exc:
            return exc.reason
        return "ok"

    worker = verdict(
        lambda: command_for_payload(payload, kind="k", allow_shell=True, default_timeout=None)
    )
    if "argv" not in payload and "shell" not in payload:
        worker = "ok"  # a handler's payload: not checked before it is stored
    assert verdict(lambda: check_payload(payload, kind="k")) == worker
