"""What a worker may run: its policy, read from a TOML file and the worker's flags.

Without a policy, whoever can insert a job runs any program, as the
worker's user, on every worker host. A policy narrows that with three rules:

- ``handlers_only``: only jobs whose kind has a handler run; an ``argv`` or
  ``shell`` payload never does.
- ``programs``: an allowlist of exact files and of directories. The program
  a job names is resolved as the runner will resolve it (looked up in the
  job's PATH, then every symlink and ``..`` resolved), and that file must be
  listed or lie below a listed directory. A ``shell`` payload runs
  ``/bin/sh``, which must be allowed too. Handlers are checked when the
  worker starts.
- loader variables: a payload's ``env`` may not set a variable that changes
  what a program loads or runs (`LOADER_PREFIXES`, `LOADER_VARIABLES`)
  unless ``allow_env`` names it.

The functions here return the reason a job is refused (None: allowed);
``payload.py`` turns it into a permanent failure, and ``enqueue --policy``
into an error before anything is written. No printing, no database.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import shlex
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pgqctl.errors import BadInput
from pgqctl.runner import (
    Command,
    find_program,  # resolve exactly as the runner does
)

# Variables that make a program load or run other code than its own: the
# dynamic loader's, the C library's, those of shells and of the common
# interpreters. PATH is one: the allowlist checks the program a job names,
# but that program may start others by name, which PATH would then choose.
# The list cannot cover every tool's own variables (git's GIT_SSH_COMMAND,
# a pager's...): allow only programs that do not read such variables.
LOADER_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_")
LOADER_VARIABLES = frozenset(
    (
        "PATH",
        # the C library
        "GCONV_PATH",
        "GLIBC_TUNABLES",
        "LOCPATH",
        "NLSPATH",
        "HOSTALIASES",
        "OPENSSL_CONF",
        "OPENSSL_MODULES",
        # shells
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "IFS",
        # interpreters
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONPLATLIBDIR",
        "PYTHONWARNINGS",
        "PYTHONBREAKPOINT",
        "PERL5LIB",
        "PERLLIB",
        "PERL5OPT",
        "PERL5DB",
        "RUBYLIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "NODE_PATH",
        "LUA_INIT",
        "LUA_PATH",
        "LUA_CPATH",
        "JAVA_TOOL_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "_JAVA_OPTIONS",
        "CLASSPATH",
    )
)

FILE_KEYS = ("handlers_only", "programs", "allow_env", "handlers")


def is_loader_variable(name: str) -> bool:
    return name in LOADER_VARIABLES or name.startswith(LOADER_PREFIXES)


@dataclass(frozen=True)
class Policy:
    """The rules a worker applies to every job (see the module's docstring)."""

    handlers_only: bool = False
    # As written; None: any program.
    programs: tuple[str, ...] | None = None
    allow_env: frozenset[str] = frozenset()
    # (KIND, command) pairs of the file's [handlers], run as --handler would.
    handlers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Where the rules come from, for messages: a file name, or None for flags only.
    source: str | None = None

    @property
    def name(self) -> str:
        """What the worker's start line calls it: its file, or its flags."""
        return self.source or "from the worker's options"

    @functools.cached_property
    def handler_map(self) -> Mapping[str, tuple[str, ...]]:
        """The command of each kind the file gives a handler."""
        return dict(self.handlers)

    @functools.cached_property
    def _allowed(self) -> tuple[frozenset[str], tuple[str, ...]]:
        """The allowlist resolved: (files, directories each ending in /)."""
        files, dirs = set(), []
        for entry in self.programs or ():
            real = os.path.realpath(entry)
            if entry.endswith("/") or os.path.isdir(real):
                dirs.append(real.rstrip("/") + "/")
            else:
                files.add(real)
        return frozenset(files), tuple(dirs)

    def kind_refusal(self, kind: str, has_handler: bool) -> str | None:
        """Why a job of `kind` is refused before its payload is read."""
        if self.handlers_only and not has_handler:
            return (
                f"kind {kind!r} has no handler, and the policy runs only kinds that have "
                f"one (handlers_only): give the worker --handler {kind}=COMMAND"
                f"{self._or_file('[handlers]')}"
            )
        return None

    def command_refusal(self, command: Command, environ: Mapping[str, str]) -> str | None:
        """Why a payload's command is refused: a loader variable in its env,
        or a program off the allowlist. `environ` is the environment the
        worker gives every job, which the command's env extends."""
        for name in command.env:
            if is_loader_variable(name) and name not in self.allow_env:
                return (
                    f'"env" sets {name}, which changes what programs load or run, and the '
                    f"policy does not allow it (allow_env): allow it with --allow-env {name}"
                    f"{self._or_file('allow_env')}"
                )
        if self.programs is None:
            return None
        path = command.env.get("PATH", environ.get("PATH", os.defpath))
        return self.program_refusal(command.argv[0], path, command.cwd)

    def program_refusal(self, program: str, path: str, cwd: str | None) -> str | None:
        """Why `program` (a job's argv[0], looked up in `path` from `cwd`)
        is off the allowlist; None if it is on it, or there is none."""
        if self.programs is None:
            return None
        try:
            found = find_program(program, {"PATH": path})
        except FileNotFoundError:
            return f"command not found: {_shown(program)} (a program must exist to be checked)"
        except OSError as exc:
            return f"cannot run {_shown(program)}: {exc.strerror or exc}"
        if not os.path.isabs(found):  # relative to the job's cwd, as the child sees it
            found = os.path.join(os.getcwd(), cwd or "", found)
        real = _real_path(found)
        files, dirs = self._allowed
        if real in files or real.startswith(dirs):
            return None
        shown = _shown(real) if program == real else f"{_shown(program)} ({_shown(real)})"
        return (
            f"program {shown} is not on the policy's allowlist (programs): allow it with "
            f"--allow-program {_shown(shlex.quote(real))}{self._or_file('programs')}"
        )

    def check_handlers(
        self, handlers: Iterable[tuple[str, Sequence[str]]], environ: Mapping[str, str]
    ) -> None:
        """BadInput unless every handler's program is on the allowlist, and
        some handler exists under handlers_only: checked when the worker starts."""
        handlers = list(handlers)
        if self.handlers_only and not handlers:
            raise BadInput(
                "the policy runs only kinds that have a handler (handlers_only), and the "
                "worker has none: give it --handler KIND=COMMAND, or [handlers] in the policy file"
            )
        for kind, argv in handlers:
            why = self.program_refusal(argv[0], environ.get("PATH", os.defpath), None)
            if why is not None:
                raise BadInput(f"the handler of kind {kind!r}: {why}")

    def _or_file(self, key: str) -> str:
        return f" or {key} in {self.source}" if self.source else ""


def _shown(text: str) -> str:
    """`text` for a one-line message: as it is, or as a JSON string when it
    holds a line end or another control character."""
    return text if text.isprintable() else json.dumps(text)


def _real_path(path: str) -> str:
    """os.path.realpath(path), remembered for `_RESOLVED_SECONDS`.

    Resolving costs a system call per component of the path (some 20 µs,
    a tenth of what the worker spends on a short job), and the runner
    remembers its PATH lookups as long. A link changed meanwhile is seen
    that much later: links in allowed directories are the operator's, as
    those directories must be.
    """
    now = time.monotonic()
    found = _RESOLVED.get(path)
    if found is not None and found[1] > now:
        return found[0]
    real = os.path.realpath(path)
    if len(_RESOLVED) >= _RESOLVED_KEPT:
        _RESOLVED.clear()
    _RESOLVED[path] = (real, now + _RESOLVED_SECONDS)
    return real


_RESOLVED_SECONDS = 1.0
_RESOLVED_KEPT = 1000
# path -> (its real path, until when it is trusted); any thread may use it.
_RESOLVED: dict[str, tuple[str, float]] = {}


def with_flags(
    policy: Policy | None,
    *,
    handlers_only: bool = False,
    programs: Sequence[str] = (),
    allow_env: Sequence[str] = (),
) -> Policy | None:
    """`policy` (from a file, or None) with the worker's flags added to it;
    None when neither gives a rule (no policy: anything runs)."""
    if policy is None and not (handlers_only or programs or allow_env):
        return None
    base = policy or Policy()
    for entry in programs:
        _check_program_entry(entry, "--allow-program")
    for name in allow_env:
        _check_env_name(name, "--allow-env")
    listed = None if base.programs is None and not programs else (*(base.programs or ()), *programs)
    return dataclasses.replace(
        base,
        handlers_only=base.handlers_only or handlers_only,
        programs=listed,
        allow_env=base.allow_env | frozenset(allow_env),
    )


def read_policy(path: str) -> Policy:
    """The policy in a TOML file; BadInput (one line) says what is wrong with it."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found,no-redef]

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise BadInput(f"cannot read policy file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise BadInput(f"policy file {path} is not UTF-8 text: a policy is TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"policy file {path} is not valid TOML: {exc}") from None
    for key in doc:
        if key not in FILE_KEYS:
            match = difflib.get_close_matches(key, FILE_KEYS, n=1)
            guess = f" (did you mean {match[0]!r}?)" if match else ""
            raise BadInput(
                f"policy file {path}: unknown key {key!r}{guess}; keys: {', '.join(FILE_KEYS)}"
            )
    handlers_only = doc.get("handlers_only", False)
    if not isinstance(handlers_only, bool):
        raise BadInput(f"policy file {path}: handlers_only must be true or false")
    programs = doc.get("programs")
    if programs is not None:
        for entry in _strings(programs, path, "programs", '["/usr/local/lib/jobs/"]'):
            _check_program_entry(entry, f"policy file {path}: programs")
        programs = tuple(programs)
    allow_env = _strings(doc.get("allow_env", []), path, "allow_env", '["PYTHONPATH"]')
    for name in allow_env:
        _check_env_name(name, f"policy file {path}: allow_env")
    return Policy(
        handlers_only=handlers_only,
        programs=programs,
        allow_env=frozenset(allow_env),
        handlers=_handlers(doc.get("handlers", {}), path),
        source=path,
    )


def _strings(value: object, path: str, key: str, example: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise BadInput(f"policy file {path}: {key} must be an array of strings, e.g. {example}")
    return value


def _handlers(table: object, path: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    example = 'e.g. resize = "/usr/local/bin/resize --quality 80"'
    if not isinstance(table, dict):
        raise BadInput(f"policy file {path}: handlers must be a table, [handlers], {example}")
    found = []
    for kind, command in table.items():
        try:
            argv = tuple(shlex.split(command)) if isinstance(command, str) else None
        except ValueError as exc:
            raise BadInput(f"policy file {path}: handler {kind!r}: {exc}, {example}") from None
        if not kind.strip() or not argv:
            raise BadInput(
                f"policy file {path}: handler {kind!r} must be a command line, {example}"
            )
        found.append((kind, argv))
    return tuple(found)


def _check_program_entry(entry: str, where: str) -> None:
    if not os.path.isabs(entry):
        raise BadInput(
            f"{where}: {entry!r} is not an absolute path: name a file (/usr/bin/convert) "
            "or a directory (/usr/local/lib/jobs/)"
        )


def _check_env_name(name: str, where: str) -> None:
    if not name or "=" in name or "\0" in name:
        raise BadInput(f"{where}: {name!r} is not a variable name, e.g. PYTHONPATH")
