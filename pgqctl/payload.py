"""What a job's payload means: the command it runs, and the environment it runs in.

No database, no processes, no printing: the worker (``pgqctl/worker/``) reads each
claimed job here and hands the result to the process engine (``runner.py``).

- `command_for_job` reads a payload into a `runner.Command`, or raises
  `PayloadRejected` for a payload that can never run. A rejection is
  permanent: the worker fails the job at once, without retries.
- `command_for_payload` does the same for a payload no handler takes, so
  that an ``argv`` or ``shell`` payload can be checked without a worker;
  `check_payload` is that check, as ``pgqctl enqueue`` makes it.
- `without_credentials` and `job_environment` build the child's
  environment: the worker's own, minus every way to reach the queue's
  database, plus the job's `env`, plus the ``PGQCTL_JOB_*`` variables.

Payload rules. With a handler for the job's kind (``--handler KIND=CMD``),
the handler runs with the payload, whatever it holds, as compact JSON on
stdin; the payload is not interpreted and the worker's default timeout
applies. Otherwise the payload must be an object with either ``argv`` (a
non-empty array of strings, run directly) or ``shell`` (a string run with
``/bin/sh -c``, only when the worker allows shell payloads), and optionally
``env`` (object of strings), ``cwd`` (string), ``timeout`` (a positive
number of seconds, or a duration as the CLI takes it, "90s", "5m"; at most
durations.MAX_SECONDS, 100 years, as every duration pgqctl takes; overrides
the worker's default) and ``stdin`` (string). A ``null``
optional key counts as absent. Any other key is rejected: in a payload that
pgqctl itself interprets, an unknown key is almost always a typo (``timout``)
that would otherwise be silently ignored.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import os
from collections.abc import Mapping, Sequence

from pgqctl.config import LIBPQ_SELECTORS
from pgqctl.durations import MAX_SECONDS, UNITS_TEXT, parse_duration
from pgqctl.errors import BadInput
from pgqctl.fartime import FarTime
from pgqctl.policy import Policy
from pgqctl.runner import Command

_SHELL = "/bin/sh"
_OPTIONAL_KEYS = ("env", "cwd", "timeout", "stdin")
_KNOWN_KEYS = frozenset(("argv", "shell", *_OPTIONAL_KEYS))

# Variables that point a client at a database or log it in. The child must
# not reach the queue's database with the worker's credentials, so none of
# these is inherited (a job's own `env` may still set them). PGQCTL_* goes
# too: it holds the DSN and the worker's options. This closes the
# environment only: a child running as the worker's user can still read
# that user's ~/.pgpass and ~/.pg_service.conf, or the embedded server's
# socket; run the worker as a user that has none of these to go further.
_CREDENTIAL_PREFIXES = ("PGQCTL_", "PGSSL", "PGGSS")
_CREDENTIAL_NAMES = frozenset(
    (
        "DATABASE_URL",
        # libpq's connection variables (PostgreSQL 18 docs, "Environment
        # Variables"), minus the ones that only shape a session (PGDATESTYLE,
        # PGTZ, PGGEQO, PGCLIENTENCODING): those that choose the server and
        # login, then the rest.
        *LIBPQ_SELECTORS,
        "PGPASSFILE",
        "PGSERVICEFILE",
        "PGSYSCONFDIR",  # where libpq looks for pg_service.conf
        "PGOPTIONS",
        "PGAPPNAME",
        "PGREQUIRESSL",
        "PGREQUIREPEER",
        "PGREQUIREAUTH",
        "PGCHANNELBINDING",
        "PGKRBSRVNAME",
        "PGCONNECT_TIMEOUT",
        "PGTARGETSESSIONATTRS",
        "PGLOADBALANCEHOSTS",
        "PGMINPROTOCOLVERSION",
        "PGMAXPROTOCOLVERSION",
    )
)


class PayloadRejected(Exception):
    """A payload that can never run. `reason` says why and what to do."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def command_for_job(
    payload: object,
    *,
    kind: str,
    handlers: Mapping[str, Sequence[str]],
    allow_shell: bool,
    default_timeout: float | None,
    policy: Policy | None = None,
    environ: Mapping[str, str] | None = None,
) -> Command:
    """The command a job runs, or `PayloadRejected` if it can never run.

    Under a `policy`, also `PayloadRejected` for a job it refuses; `environ`
    is the environment every job gets (`without_credentials`), in which the
    program a payload names is looked up. Handlers are not checked here:
    `Policy.check_handlers` checks them once, when the worker starts.
    """
    handler = handlers.get(kind)
    if handler is not None:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
        return Command(tuple(handler), stdin=text.encode(), timeout=default_timeout)
    if policy is not None:
        why = policy.kind_refusal(kind, has_handler=False)
        if why is not None:
            raise PayloadRejected(why)
    command = command_for_payload(
        payload, kind=kind, allow_shell=allow_shell, default_timeout=default_timeout
    )
    if policy is not None:
        why = policy.command_refusal(command, {} if environ is None else environ)
        if why is not None:
            raise PayloadRejected(why)
    return command


def command_for_payload(
    payload: object,
    *,
    kind: str,
    allow_shell: bool,
    default_timeout: float | None,
) -> Command:
    """The command an ``argv`` or ``shell`` payload asks for, or `PayloadRejected`.

    What every worker with no handler for `kind` does with a job's payload
    (`kind` only names the handler a rejection suggests). With `allow_shell`
    True it checks a payload before it is stored: what it rejects then, no
    worker can run but one with a handler for `kind`.
    """
    if type(payload) is dict and len(payload) == 1 and _plain_argv(payload.get("argv")):
        # {"argv": [...]} alone, the most common: nothing else to read.
        return Command(tuple(payload["argv"]), timeout=default_timeout)
    if not isinstance(payload, dict):
        raise PayloadRejected(
            f"payload is {_json_type(payload)}, not an object: enqueue "
            f'{{"argv": [...]}} or {{"shell": "..."}}, {_handler_hint(kind)}'
        )
    unknown = sorted(str(key) for key in payload if key not in _KNOWN_KEYS)
    if "argv" not in payload and "shell" not in payload:
        guess = _close_key(unknown, ("argv", "shell"))
        if guess:
            raise PayloadRejected(f'payload has neither "argv" nor "shell"{guess}')
        raise PayloadRejected(
            f'payload has neither "argv" nor "shell": enqueue {{"argv": [...]}}, '
            f"{_handler_hint(kind)}"
        )
    if unknown:
        listed = ", ".join(f'"{key}"' for key in unknown)
        guess = _close_key(unknown, tuple(_KNOWN_KEYS))
        raise PayloadRejected(
            f"unknown payload key{'s' if len(unknown) > 1 else ''} {listed}{guess or ''}"
            ": allowed keys are argv or shell, env, cwd, timeout, stdin"
        )
    if "argv" in payload and "shell" in payload:
        raise PayloadRejected('payload has both "argv" and "shell": keep only one')

    if "shell" in payload:
        if not allow_shell:
            raise PayloadRejected(
                "shell payloads need `pgqctl worker --allow-shell`; "
                'or enqueue {"argv": [...]} to run without a shell'
            )
        script = payload["shell"]
        if not isinstance(script, str) or not script.strip():
            got = _json_type(script) if not isinstance(script, str) else "a blank string"
            raise PayloadRejected(
                f'"shell" must be a command line, e.g. {{"shell": "ls | wc -l"}}, got {got}'
            )
        _no_nul(script, '"shell"')
        argv: tuple[str, ...] = (_SHELL, "-c", script)
    else:
        argv = _argv(payload["argv"])

    timeout = _timeout(payload.get("timeout"))
    stdin = payload.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise PayloadRejected(
            f'"stdin" must be a string, got {_json_type(stdin)}: encode structured '
            "data as a string, or use a handler to get the payload as JSON on stdin"
        )
    return Command(
        argv,
        env=_env(payload.get("env")),
        cwd=_cwd(payload.get("cwd")),
        stdin=None if stdin is None else stdin.encode(),
        timeout=default_timeout if timeout is None else timeout,
    )


def check_payload(payload: Mapping[str, object], kind: str) -> None:
    """`PayloadRejected` for an ``argv`` or ``shell`` payload that no worker
    without a handler for `kind` can run: what `command_for_payload` refuses
    with shell payloads allowed. For checking a payload before it is stored
    (``pgqctl enqueue``); a payload with neither key is a handler's, and is
    not checked.

    A bulk load checks one payload per job, so an ``argv`` payload whose
    every key plainly follows the rules is passed here without building its
    command; any other goes through `command_for_payload`, which accepts it
    or says what is wrong (tests check that both agree).
    """
    argv = payload.get("argv")
    if _plain_argv(argv):
        if (
            len(payload) == 1  # {"argv": [...]} alone, the most common
            or ("shell" not in payload and _KNOWN_KEYS.issuperset(payload) and _options(payload))
        ):
            return
    elif "argv" not in payload and "shell" not in payload:
        return
    command_for_payload(payload, kind=kind, allow_shell=True, default_timeout=None)


def check_policy(payload: object, kind: str, policy: Policy) -> None:
    """`PayloadRejected` for a job a worker under `policy` would refuse,
    checked where it is enqueued (``pgqctl enqueue --policy``): the kinds
    with a handler are those of the policy file's [handlers], and programs
    are looked up in this process's PATH. A payload with neither ``argv``
    nor ``shell`` of a kind the file gives no handler is a handler's, and
    passes unless the policy runs only handler kinds.
    """
    is_command = isinstance(payload, dict) and ("argv" in payload or "shell" in payload)
    handlers = policy.handler_map
    if not is_command and kind not in handlers and not policy.handlers_only:
        return
    command_for_job(
        payload,
        kind=kind,
        handlers=handlers,
        allow_shell=True,
        default_timeout=None,
        policy=policy,
        environ=os.environ,
    )


def _plain_argv(argv: object) -> bool:
    """Whether `argv` plainly follows the rules: a list of strings, the
    first not empty, no NUL; False when unsure."""
    if type(argv) is not list or not argv or type(argv[0]) is not str or not argv[0]:
        return False
    try:
        # Every word a string (join raises TypeError for any other), no NUL.
        return "\0" not in "".join(argv)
    except TypeError:
        return False


def _options(payload: Mapping[str, object]) -> bool:
    """Whether the optional keys of an argv payload plainly follow the rules;
    False when unsure."""
    env = payload.get("env")
    if env is not None:
        if type(env) is not dict:
            return False
        for name, value in env.items():
            if type(value) is not str or not name or "=" in name or "\0" in name + value:
                return False
    cwd = payload.get("cwd")
    if cwd is not None and (type(cwd) is not str or not cwd or "\0" in cwd):
        return False
    timeout = payload.get("timeout")
    if timeout is not None and (
        type(timeout) not in (int, float) or not 0 < timeout <= MAX_SECONDS  # type: ignore[operator]
    ):
        return False
    stdin = payload.get("stdin")
    return stdin is None or type(stdin) is str


def without_credentials(base: Mapping[str, str]) -> dict[str, str]:
    """A copy of `base` without any way to reach the queue's database.

    Pass a dict taken from os.environ once at startup, not os.environ itself:
    reading os.environ decodes every variable again (some 30 µs a job).
    """
    return {
        name: value
        for name, value in base.items()
        if name not in _CREDENTIAL_NAMES and not name.startswith(_CREDENTIAL_PREFIXES)
    }


def job_environment(
    clean: Mapping[str, str],
    *,
    job_id: int,
    kind: str,
    queue: str,
    attempt: int,
    extra: Mapping[str, str],
    claim: int | None = None,
    schema: str = "public",
    schedule: str | None = None,
    tick: dt.datetime | None = None,
) -> dict[str, str]:
    """`clean` (from `without_credentials`), the job's `extra`, then
    PGQCTL_JOB_*, which the job's `extra` cannot override (the id, the
    claim, the fencing token, and the schema are what a program needs to
    complete its own job in its own transaction: pgqctl/completion.py); for a job a
    schedule enqueued, PGQCTL_SCHEDULE and PGQCTL_TICK (the tick's time,
    ISO 8601 in UTC), so that it can be idempotent per tick. A job of no
    schedule gets neither, even from the worker's own environment."""
    env = dict(clean)
    env.update(extra)
    env["PGQCTL_JOB_ID"] = str(job_id)
    env["PGQCTL_JOB_KIND"] = kind
    env["PGQCTL_JOB_QUEUE"] = queue
    env["PGQCTL_JOB_ATTEMPT"] = str(attempt)
    env["PGQCTL_JOB_CLAIM"] = str(attempt if claim is None else claim)
    env["PGQCTL_JOB_SCHEMA"] = schema
    env.pop("PGQCTL_SCHEDULE", None)
    env.pop("PGQCTL_TICK", None)
    if schedule is not None:
        env["PGQCTL_SCHEDULE"] = schedule
        if tick is not None:
            env["PGQCTL_TICK"] = iso_utc(tick)
    return env


def iso_utc(when: dt.datetime) -> str:
    """2026-12-02T03:00:00Z: a time in UTC, ISO 8601, as PGQCTL_TICK has it;
    one no datetime holds (a tick of 'infinity', written with plain SQL) as
    PostgreSQL writes it."""
    if isinstance(when, FarTime):
        return when.text
    utc = when.astimezone(dt.timezone.utc)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += f".{utc.microsecond:06d}".rstrip("0")
    return text + "Z"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _handler_hint(kind: str) -> str:
    return f"or run kind {kind!r} with `pgqctl worker --handler {kind}=CMD`"


def _close_key(unknown: Sequence[str], known: Sequence[str]) -> str | None:
    for key in unknown:
        match = difflib.get_close_matches(key, known, n=1, cutoff=0.7)
        if match:
            return f' (did you mean "{match[0]}" instead of "{key}"?)'
    return None


def _no_nul(text: str, where: str) -> None:
    if "\0" in text:
        raise PayloadRejected(
            f"{where} contains a NUL character, which no process can receive: remove it"
        )


def _argv(argv: object) -> tuple[str, ...]:
    example = '{"argv": ["ls", "-l"]}'
    if isinstance(argv, str):
        raise PayloadRejected(
            f'"argv" must be an array of strings, got a string: split the command into '
            f'words, e.g. {example}, or use {{"shell": "..."}}'
        )
    if not isinstance(argv, list):
        raise PayloadRejected(
            f'"argv" must be an array of strings, e.g. {example}, got {_json_type(argv)}'
        )
    if not argv:
        raise PayloadRejected(f'"argv" is empty: put the program first, e.g. {example}')
    for i, item in enumerate(argv):
        if not isinstance(item, str):
            raise PayloadRejected(
                f'"argv"[{i}] is {_json_type(item)}, not a string: quote it, e.g. "42"'
            )
        if "\0" in item:  # the message is made only then: this runs per word
            _no_nul(item, f'"argv"[{i}]')
    if not argv[0]:
        raise PayloadRejected('"argv"[0] is an empty string: it must name the program to run')
    return tuple(argv)


def _env(env: object) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise PayloadRejected(
            f'"env" must be an object of strings, e.g. {{"env": {{"LANG": "C"}}}}, '
            f"got {_json_type(env)}"
        )
    for name, value in env.items():
        if not name or "=" in name:
            raise PayloadRejected(
                f'"env" name {json.dumps(name)} is not a variable name: '
                'names are non-empty and have no "="'
            )
        if "\0" in name:  # messages are made only then: this runs per variable
            _no_nul(name, f'"env" name {json.dumps(name)}')
        if not isinstance(value, str):
            raise PayloadRejected(
                f'"env"["{name}"] is {_json_type(value)}, not a string: quote it, e.g. "42"'
            )
        if "\0" in value:
            _no_nul(value, f'"env"["{name}"]')
    return dict(env)


def _cwd(cwd: object) -> str | None:
    if cwd is None:
        return None
    if not isinstance(cwd, str) or not cwd:
        got = "an empty string" if cwd == "" else _json_type(cwd)
        raise PayloadRejected(
            f'"cwd" must be a directory path, e.g. {{"cwd": "/srv/app"}}, got {got}'
        )
    _no_nul(cwd, '"cwd"')
    return cwd


def _timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    seconds: object = timeout
    if isinstance(timeout, str):
        # The forms `--timeout` takes: "90s", "5m", "1h30m", or "30" (seconds).
        try:
            seconds = parse_duration(timeout, what="")
        except BadInput:
            seconds = None
    # Bounded, as every duration pgqctl takes: a deadline of 1e308 seconds
    # overflows the worker's timers. Compared, not converted: JSON's 1e400 is
    # an int too large for a float (NaN compares False: refused too).
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not 0 < seconds <= MAX_SECONDS
    ):
        shown = (
            json.dumps(timeout) if isinstance(timeout, (str, int, float)) else _json_type(timeout)
        )
        if len(shown) > 40:  # 1e400 as a JSON number has 401 digits
            shown = shown[:37] + "..."
        raise PayloadRejected(
            '"timeout" must be a positive duration of at most 100 years, e.g. '
            f'{{"timeout": 30}} (seconds) or {{"timeout": "5m"}} (units {UNITS_TEXT}), '
            f"got {shown}"
        )
    return float(seconds)
