"""A job cannot read its worker's database password.

The worker runs as an unprivileged user (root may read any process), with
the password in PGQCTL_DSN, and runs a job of that same user that looks for
the password in the worker's and the guard's /proc files and memory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from psycopg import conninfo

from tests.conftest import run_cli
from tests.support.jobrows import insert_jobs, job
from tests.support.servers import REPO_ROOT

SECRET = "s3cret-Pw-9f2e"
NOBODY = 65534

# The job: for the worker (its parent) and the worker's guard, what reading
# each of environ, cmdline and mem (every readable mapping) gives. It gets
# the password reversed, so that the payload the worker holds in memory does
# not contain it.
PROBE = r"""
import os, sys, time
secret = sys.argv[1][::-1].encode()
worker = os.getppid()

def guard_of(parent):
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if ppid == parent and b"pgqctl.guard" in command:
            return int(name)
    return None

def memory_holds_secret(pid):
    found = False
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            low, high = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(low)
                found = found or secret in mem.read(high - low)
            except (OSError, OverflowError, ValueError):
                pass
    return found

def look(pid, what):
    try:
        if what == "mem":
            holds = memory_holds_secret(pid)
        else:
            with open(f"/proc/{pid}/{what}", "rb") as f:
                holds = secret in f.read()
    except PermissionError:
        return "denied"
    except OSError as exc:
        return f"error {exc.errno}"
    return "password" if holds else "read, no password"

for what in ("environ", "cmdline", "mem"):
    print(f"worker {what}: {look(worker, what)}", flush=True)
guard = guard_of(worker)
if guard is None:
    sys.exit("guard not found")
# The guard may still be starting: it never had the password to begin with,
# and closes its /proc files once its Python runs.
found = look(guard, "environ") == "password" or look(guard, "mem") == "password"
print(f"guard at once: {'password' if found else 'no password'}", flush=True)
deadline = time.monotonic() + 5
while look(guard, "environ") != "denied" and time.monotonic() < deadline:
    time.sleep(0.02)
for what in ("environ", "cmdline", "mem"):
    print(f"guard {what}: {look(guard, what)}", flush=True)
"""


def as_unprivileged() -> list[str]:
    """The command prefix that runs a program as user 65534 (none if this
    process is not root already)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv"):
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    if shutil.which("runuser"):
        return ["runuser", "-u", "nobody", "--"]
    pytest.skip("running as root, with neither setpriv nor runuser to run as another user")


def python_for(prefix: list[str], env: dict[str, str]) -> str:
    """A Python that the unprivileged user can run, and that can start itself
    again (the guard) and import pgqctl: this one, or the base install's, or
    the system's of the same version. A venv under an unreadable home (/root)
    will not do."""
    system = "/usr/local/bin:/usr/bin:/bin"
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [
        sys.executable,
        getattr(sys, "_base_executable", ""),
        shutil.which(version, path=system),
        shutil.which("python3", path=system),
    ]
    same = tuple(sys.version_info[:2])
    check = (
        f"import subprocess, sys; assert sys.version_info[:2] == {same}; "
        "subprocess.run([sys.executable, '-c', 'import pgqctl, psycopg'], check=True)"
    )
    for candidate in dict.fromkeys(c for c in candidates if c):
        probe = subprocess.run(
            [*prefix, candidate, "-c", check], env=env, cwd="/", capture_output=True, timeout=30
        )
        if probe.returncode == 0:
            return candidate
    pytest.skip(f"no Python {sys.version_info[0]}.{sys.version_info[1]} the user {NOBODY} can run")


def skip_unless_reachable(prefix: list[str], python: str, env: dict[str, str]) -> None:
    """Skip when the user cannot reach the test server: the embedded one
    listens only on a socket in its owner's private data directory. The
    pass against a server on TCP (PGQCTL_TEST_DSN) runs this test."""
    probe = subprocess.run(
        [*prefix, python, "-c", "import os, psycopg; psycopg.connect(os.environ['PGQCTL_DSN'])"],
        env=env,
        cwd="/",
        capture_output=True,
        timeout=30,
    )
    if probe.returncode != 0 and b"Permission denied" in probe.stderr:
        pytest.skip(f"the user {NOBODY} cannot reach this server's socket; set PGQCTL_TEST_DSN")


def test_a_job_of_the_same_user_cannot_read_the_workers_password(
    dsn: str, conn: Any, tmp_path: Path
) -> None:
    prefix = as_unprivileged()
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": "/",
        # The tree and the packages it needs, for an interpreter outside the venv.
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), sysconfig.get_paths()["purelib"]]),
        "PGQCTL_DSN": conninfo.make_conninfo(dsn, password=SECRET),
    }
    python = python_for(prefix, env)
    skip_unless_reachable(prefix, python, env)
    [job_id] = insert_jobs(conn, [{"argv": [python, "-c", PROBE, SECRET[::-1]]}])
    log = tmp_path / "worker.log"
    with log.open("wb") as err:
        code = subprocess.run(
            [*prefix, python, "-m", "pgqctl", "worker", "--burst", "--log-format", "json"],
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            timeout=60,
        ).returncode
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert code == 0, events
    assert job(conn, job_id)["status"] == "done", events
    seen = [e["line"] for e in events if e["event"] == "output"]
    assert seen == [
        "worker environ: denied",
        "worker cmdline: read, no password",
        "worker mem: denied",
        "guard at once: no password",
        "guard environ: denied",
        "guard cmdline: read, no password",
        "guard mem: denied",
    ]
    assert not [e for e in events if e["event"] == "password_on_command_line"]


def test_a_password_on_the_command_line_is_warned_about_once(dsn: str) -> None:
    with_password = conninfo.make_conninfo(dsn, password=SECRET)
    result = run_cli("worker", "--dsn", with_password, "--burst")
    assert result.exit_code == 0, result.stderr
    warning = (
        "the password in --dsn can be read by every process on this host, this worker's "
        "jobs included (ps, /proc/PID/cmdline): give it in PGQCTL_DSN, a passfile "
        "(~/.pgpass) or a service file (PGSERVICEFILE) instead"
    )
    assert result.stderr.count(warning) == 1
    assert SECRET not in result.stderr

    result = run_cli("--dsn", with_password, "worker", "--listen-dsn", with_password, "--burst")
    assert result.stderr.count("the password in --dsn and --listen-dsn can be read") == 1

    # From the environment, or without a password: nothing to say.
    for env, args in (({"PGQCTL_DSN": with_password}, ()), ({}, ("--dsn", dsn))):
        result = run_cli("worker", *args, "--burst", env=env)
        assert result.exit_code == 0, result.stderr
        assert "can be read by every process" not in result.stderr
