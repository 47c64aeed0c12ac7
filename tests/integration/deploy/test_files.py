"""The files in deploy/ work as deploy/README.md says.

The systemd unit passes `systemd-analyze verify`, and is acted out: a worker
started with the unit's command line and environment (the unit's defaults,
then the example environment files) and stopped the way systemd stops a unit
of its KillMode (the stop signal, then SIGKILL to whatever is left after
TimeoutStopSec) must exit 0 in time, with every job done or back in the
queue. The Kubernetes Deployment is acted out the same way (SIGTERM to the
container's main process, SIGKILL after terminationGracePeriodSeconds). The
cron lines and the CronJobs run for real against a test database, as cron
and Kubernetes would start them.

The shipped files keep production values (a 30 s grace); the stop tests run
with a 2 s grace and the same margin between the grace and the stop timeout,
since the rest of a stop (5 s from SIGTERM to SIGKILL, 10 s of reporting)
does not shrink with the grace.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import pytest

from pgqctl.durations import parse_duration
from pgqctl.policy import is_loader_variable, read_policy
from tests.conftest import alive
from tests.support.jobrows import add_jobs, ago, expired
from tests.support.processes import start_pgqctl, web_address
from tests.support.servers import REPO_ROOT

__all__ = ["start_pgqctl"]  # a fixture

DEPLOY = REPO_ROOT / "deploy"
UNIT = DEPLOY / "pgqctl-worker@.service"
DSN_ENV = DEPLOY / "pgqctl.env.example"
WORKER_ENV = DEPLOY / "worker.env.example"
CRON = DEPLOY / "pgqctl.cron"
K8S_WORKER = DEPLOY / "kubernetes" / "worker.yaml"
K8S_CRONJOBS = DEPLOY / "kubernetes" / "cronjobs.yaml"
K8S_WEB = DEPLOY / "kubernetes" / "web.yaml"
WEB_UNIT = DEPLOY / "pgqctl-web.service"
POLICY = DEPLOY / "policy.toml"

# Where deploy/README.md installs the environment files.
DSN_ENV_PATH = "/etc/pgqctl/pgqctl.env"
WORKER_ENV_PATH = "/etc/pgqctl/worker-{instance}.env"
POLICY_PATH = "/etc/pgqctl/policy.toml"
STATE_DIR = "/var/lib/pgqctl"

INSTANCE = "default"  # the queue jobs go to when none is named
UNIT_NAME = f"pgqctl-worker@{INSTANCE}.service"

# What a stop may take beyond --grace (docs/worker.md, Signals): a job that
# ignores SIGTERM gets SIGKILL 5 s later, then the worker tries for 10 s to
# report to a database it cannot reach; and some room for the rest.
TERM_TO_KILL = 5.0
REPORT_WAIT = 10.0
MARGIN = 5.0
BEYOND_GRACE = TERM_TO_KILL + REPORT_WAIT + MARGIN
DEFAULT_GRACE = 30.0  # the worker's own, when nothing sets one
TEST_GRACE = 2.0

# What systemd gives a service besides what the unit sets (systemd.exec(5)).
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What cron gives a command before the crontab's own variables (crontab(5)).
CRON_PATH = "/usr/bin:/bin"


def missing(reason: str) -> NoReturn:
    """A tool the test needs is absent: CI must have it; elsewhere, skip."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def need_module(name: str, package: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        missing(f"{name} is not installed (pip install '.[test]' brings {package})")


# -- reading the files as their readers do ----------------------------------------

Unit = dict[str, dict[str, list[str]]]


def read_unit(text: str) -> Unit:
    """A unit file's sections and their settings, each a list of values in
    order; an empty assignment resets the list, as systemd does."""
    sections: Unit = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        line = f"{pending} {line}" if pending else line
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        pending = ""
        if line.startswith("["):
            assert line.endswith("]"), line
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"not a setting: {raw!r}"
        values = current.setdefault(key.strip(), [])
        if value.strip():
            values.append(value.strip())
        else:
            values.clear()
    return sections


def one(section: dict[str, list[str]], key: str) -> str:
    values = section.get(key, [])
    assert len(values) == 1, f"{key}= should be set once, is {values}"
    return values[0]


def expand(value: str, instance: str = INSTANCE) -> str:
    """The specifiers the unit may use, for one instance of the template."""
    known = {
        "i": instance,
        "I": instance,
        "n": f"pgqctl-worker@{instance}.service",
        "p": "pgqctl-worker",
        "%": "%",
    }

    def replace(match: re.Match[str]) -> str:
        assert match[1] in known, f"specifier %{match[1]} in {value!r}: teach this test about it"
        return known[match[1]]

    return re.sub(r"%(.)", replace, value)


_SPAN_UNITS = {
    **dict.fromkeys(["us", "usec"], 1e-6),
    **dict.fromkeys(["ms", "msec"], 1e-3),
    **dict.fromkeys(["s", "sec", "second", "seconds"], 1.0),
    **dict.fromkeys(["m", "min", "minute", "minutes"], 60.0),
    **dict.fromkeys(["h", "hr", "hour", "hours"], 3600.0),
}


def systemd_seconds(text: str) -> float:
    """A systemd time span (systemd.time(7)): `90`, `60s`, `1min 30s`."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text)
    assert parts and "".join(n + u for n, u in parts) == re.sub(r"\s", "", text), text
    return sum(float(n) * _SPAN_UNITS[u] for n, u in parts)


def read_env_file(text: str) -> dict[str, str]:
    """An environment file as systemd reads it (systemd.exec(5)), for the
    forms that /bin/sh reads the same way: comment lines, NAME=word, and
    NAME='value' (which may span lines). Anything else fails: a file that
    the two read differently would configure cron and the workers apart."""
    env: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        name, sep, value = stripped.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", name), f"not NAME=value: {line!r}"
        if value.startswith("'"):
            value = value[1:]
            while "'" not in value:
                value += "\n" + next(lines)
            value, _, rest = value.partition("'")
            assert rest == "", f"{name}: text after the closing quote ({rest!r})"
        else:
            # Unquoted, sh would cut the value at a blank, run `;`, `&`...
            # and systemd would keep a trailing `# comment` in it.
            assert not re.search(r"[\s'\"\\$`;&|<>()#*?~]", value), (
                f"{name}={value}: put the value in single quotes"
            )
        env[name] = value
    return env


def sh_reads(path: Path) -> dict[str, str]:
    """The variables /bin/sh gets from sourcing `path` the way the cron lines do."""
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    script = 'set -a && . "$1" && exec "$2" -c "$3"'
    result = subprocess.run(
        ["/bin/sh", "-c", script, "sh", str(path), sys.executable, dump],
        env={"PATH": CRON_PATH},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return {k: v for k, v in json.loads(result.stdout).items() if k.startswith("PGQCTL_")}


def replace_setting(text: str, name: str, value: str) -> str:
    """`text` with the one line that sets `name` setting it to `value`."""
    assert "'" not in value
    new, count = re.subn(rf"^{name}=.*$", f"{name}='{value}'", text, flags=re.M)
    assert count == 1, f"the example should set {name} once"
    return new


def worker_variables() -> set[str]:
    """The variables `pgqctl worker` reads its options from."""
    from pgqctl.cli import cli

    worker = cli.commands["worker"]
    return {p.envvar for p in worker.params if isinstance(p.envvar, str)}


def load_yaml(path: Path) -> list[dict[str, Any]]:
    yaml = need_module("yaml", "PyYAML")
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, path
    return docs


def deployment() -> dict[str, Any]:
    [doc] = load_yaml(K8S_WORKER)
    assert (doc["apiVersion"], doc["kind"]) == ("apps/v1", "Deployment")
    return doc


def cronjobs() -> list[dict[str, Any]]:
    docs = load_yaml(K8S_CRONJOBS)
    assert {(d["apiVersion"], d["kind"]) for d in docs} == {("batch/v1", "CronJob")}
    return docs


def container_env(container: dict[str, Any], dsn: str) -> dict[str, str]:
    """A container's environment, the DSN Secret holding `dsn`."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            assert var["name"] == "PGQCTL_DSN", var
            assert ref["name"] and ref["key"], ref
            env["PGQCTL_DSN"] = dsn
    return env


def dsn_from_secret(container: dict[str, Any]) -> None:
    [var] = [v for v in container["env"] if v["name"] == "PGQCTL_DSN"]
    assert "value" not in var, "a DSN holds a password: keep it in a Secret"
    assert set(var["valueFrom"]) == {"secretKeyRef"}
    assert var["valueFrom"]["secretKeyRef"] == {"name": "pgqctl-database", "key": "dsn"}
    assert "DATABASE_URL" not in {v["name"] for v in container["env"]}


# -- the unit as systemd reads it ---------------------------------------------------


@dataclass
class Launch:
    """How a service manager starts the worker and stops it."""

    argv: list[str]  # as shipped; pgqctl itself is replaced when it runs
    env: dict[str, str]
    signal_all: bool  # the stop signal to every process, not the main one alone
    stop_signal: int
    stop_timeout: float
    grace: float


def unit_launch(files: dict[str, str]) -> Launch:
    """The worker as systemd starts the shipped unit's instance, its
    environment files having the `files` contents."""
    service = read_unit(UNIT.read_text())["Service"]
    argv = shlex.split(expand(one(service, "ExecStart")))
    assert argv[0][0] not in "-@:+!|", f"ExecStart prefix in {argv[0]!r}"
    env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8"}
    for value in service.get("Environment", []):
        for word in shlex.split(expand(value)):
            name, sep, setting = word.partition("=")
            assert sep, word
            env[name] = setting
    for value in service.get("EnvironmentFile", []):
        path = expand(value)
        optional = path.startswith("-")
        path = path.removeprefix("-")
        if path in files:
            env.update(read_env_file(files[path]))
        else:
            assert optional, f"EnvironmentFile {path} is required and the test has none"
    kill_mode = service.get("KillMode", ["control-group"])[-1]
    assert kill_mode in ("mixed", "control-group"), f"KillMode={kill_mode}: see the unit test"
    timeout = service.get("TimeoutStopSec", ["90s"])[-1]  # systemd's default
    return Launch(
        argv=argv,
        env=env,
        signal_all=kill_mode == "control-group",
        stop_signal=signal.Signals[service.get("KillSignal", ["SIGTERM"])[-1]],
        stop_timeout=systemd_seconds(timeout),
        grace=parse_duration(env.get("PGQCTL_GRACE", str(DEFAULT_GRACE))),
    )


def shipped_env_files() -> dict[str, str]:
    return {
        DSN_ENV_PATH: DSN_ENV.read_text(),
        WORKER_ENV_PATH.format(instance=INSTANCE): WORKER_ENV.read_text(),
    }


@pytest.mark.parametrize(
    ("path", "name"), [(UNIT, UNIT_NAME), (WEB_UNIT, WEB_UNIT.name)], ids=["worker", "web"]
)
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path, path: Path, name: str) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        missing("systemd-analyze is not installed (Debian: apt-get install systemd)")
    text = path.read_text()
    program = shlex.split(one(read_unit(text)["Service"], "ExecStart"))[0]
    # verify checks that the program exists: the copy runs a stand-in, and
    # differs from the shipped unit in that path alone.
    stand_in = tmp_path / "bin" / "pgqctl"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    copy = text.replace(f"ExecStart={program} ", f"ExecStart={stand_in} ", 1)
    assert copy != text
    shipped, tested = read_unit(text), read_unit(copy)
    del shipped["Service"]["ExecStart"], tested["Service"]["ExecStart"]
    assert shipped == tested
    unit = tmp_path / name
    unit.write_text(copy)
    result = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # An unknown key or a value it cannot parse is only a warning, exit 0:
    # any line about this unit is a finding.
    findings = [line for line in output.splitlines() if name.split("@")[0] in line]
    assert findings == [], output


def test_the_web_unit_serves_with_its_token_as_a_credential() -> None:
    service = read_unit(WEB_UNIT.read_text())["Service"]
    argv = shlex.split(one(service, "ExecStart"))
    assert argv[1:3] == ["web", "--host"] and "--token-file" in argv
    token_file = argv[argv.index("--token-file") + 1]
    credential = one(service, "LoadCredential").split(":")[0]
    assert token_file == f"%d/{credential}"  # the credentials directory
    assert one(service, "EnvironmentFile") == "/etc/pgqctl/pgqctl.env"


def test_the_unit_stops_the_worker_gracefully_and_restarts_it_on_failure() -> None:
    unit = read_unit(UNIT.read_text())
    service = unit["Service"]
    # SIGTERM to the worker alone: it stops its jobs itself after --grace.
    # control-group would send SIGTERM to the jobs too, at the start of the
    # grace, and to the worker's guard; SIGKILL still reaches every process
    # left after the timeout.
    assert one(service, "KillMode") == "mixed"
    assert one(service, "KillSignal") == "SIGTERM"
    assert service.get("SendSIGKILL", ["yes"])[-1] == "yes"
    assert "ExecStop" not in service
    launch = unit_launch(shipped_env_files())
    assert launch.grace == DEFAULT_GRACE
    # The unit's own default and the example file agree, and the timeout
    # covers either.
    unit_default = unit_launch({DSN_ENV_PATH: DSN_ENV.read_text()})
    assert unit_default.grace == launch.grace
    assert launch.stop_timeout >= launch.grace + BEYOND_GRACE, (
        f"TimeoutStopSec={launch.stop_timeout:g}s leaves the worker too little time after "
        f"its {launch.grace:g}s grace: it needs {BEYOND_GRACE:g}s more"
    )

    assert one(service, "Type") in ("simple", "exec")
    assert one(service, "Restart") == "on-failure"
    assert systemd_seconds(one(service, "RestartSec")) >= 1
    # Exit 2 is bad options: restarting cannot help.
    assert one(service, "RestartPreventExitStatus").split() == ["2"]
    assert one(service, "OOMPolicy") == "continue"

    # Everything the worker does comes from the environment files: an option
    # on the command line would silently win over them.
    assert launch.argv[1:] == ["worker"]
    assert Path(launch.argv[0]).name == "pgqctl" and Path(launch.argv[0]).is_absolute()
    # The instance is the queue, unless its own file says otherwise.
    assert unit_launch({DSN_ENV_PATH: ""}).env["PGQCTL_QUEUE"] == INSTANCE
    # The example leaves the queue to the instance name.
    assert "PGQCTL_QUEUE" not in read_env_file(WORKER_ENV.read_text())
    files = [expand(f, "emails") for f in service["EnvironmentFile"]]
    assert files == [DSN_ENV_PATH, "-" + WORKER_ENV_PATH.format(instance="emails")]

    user = one(service, "User")
    assert user not in ("root", "0")
    assert one(service, "WorkingDirectory") == STATE_DIR
    assert one(service, "StateDirectory") == Path(STATE_DIR).name
    assert one(unit["Install"], "WantedBy") == "multi-user.target"


def test_the_example_environment_files_read_alike_in_systemd_and_sh() -> None:
    readable = worker_variables()
    for path in (DSN_ENV, WORKER_ENV):
        env = read_env_file(path.read_text())
        assert env, path
        assert sh_reads(path) == env, f"/bin/sh reads {path.name} differently"
        unknown = set(env) - readable
        assert not unknown, f"{path.name}: pgqctl worker reads no {sorted(unknown)}"
    # The file cron reads holds the database alone: worker settings go per instance.
    assert set(read_env_file(DSN_ENV.read_text())) == {"PGQCTL_DSN"}
    assert parse_duration(read_env_file(WORKER_ENV.read_text())["PGQCTL_GRACE"]) > 0


# -- stopping the worker as systemd and Kubernetes do ----------------------------------


def deployment_launch(dsn: str) -> Launch:
    """The worker as the Deployment's container runs it: SIGTERM reaches the
    container's main process only (through its init), SIGKILL the rest after
    terminationGracePeriodSeconds."""
    pod = deployment()["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **container_env(container, dsn)}
    return Launch(
        argv=[*container.get("command", []), *container["args"]],
        env=env,
        signal_all=False,
        stop_signal=signal.SIGTERM,
        stop_timeout=float(pod["terminationGracePeriodSeconds"]),
        grace=parse_duration(env.get("PGQCTL_GRACE", str(DEFAULT_GRACE))),
    )


def scaled_launch(how: str, dsn: str, policy: str) -> Launch:
    """`how`'s launch with the test's grace, its stop timeout as far above it
    as the shipped files put it, and the `policy` file in place of the shipped one."""
    if how == "systemd":
        shipped = unit_launch(shipped_env_files())
        files = shipped_env_files()
        files[DSN_ENV_PATH] = replace_setting(files[DSN_ENV_PATH], "PGQCTL_DSN", dsn)
        name = WORKER_ENV_PATH.format(instance=INSTANCE)
        files[name] = replace_setting(files[name], "PGQCTL_GRACE", f"{TEST_GRACE:g}s")
        launch = unit_launch(files)
    else:
        shipped = deployment_launch(dsn)
        launch = deployment_launch(dsn)
        launch.env["PGQCTL_GRACE"] = f"{TEST_GRACE:g}s"
        launch.grace = TEST_GRACE
    assert launch.grace == TEST_GRACE and launch.env["PGQCTL_DSN"] == dsn
    assert launch.env["PGQCTL_POLICY"] == POLICY_PATH
    launch.env["PGQCTL_POLICY"] = policy
    launch.stop_timeout = shipped.stop_timeout - shipped.grace + TEST_GRACE
    return launch


def unit_processes(marker: bytes) -> set[int]:
    """Running processes started under the test's stand-in for the unit's
    cgroup or the pod: every one whose environment holds `marker`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0") and alive(
                    int(entry.name)
                ):
                    found.add(int(entry.name))
    return found


def stop(
    proc: subprocess.Popen[bytes], launch: Launch, marker: bytes, then: Callable[[], None]
) -> tuple[float, set[int]]:
    """Stop as systemd stops the unit: the stop signal (and SIGCONT) to the
    main process, or to every process; up to the stop timeout for the main
    process to exit (calling `then` once the signal is sent); then SIGKILL to
    every process left. How long the main process took, and what the SIGKILL
    found."""
    started = time.monotonic()
    for pid in unit_processes(marker) if launch.signal_all else {proc.pid}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, launch.stop_signal)
            os.kill(pid, signal.SIGCONT)
    then()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=launch.stop_timeout)
    took = time.monotonic() - started
    left = unit_processes(marker)
    for pid in left | {proc.pid}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    return took, left


def wait_for(paths: list[Path], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"timed out waiting for {paths}"
        time.sleep(0.05)


def jobs(conn: psycopg.Connection[Any]) -> dict[int, tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT id, status, attempts, max_attempts, locked_until, handbacks FROM jobs"
    ).fetchall()
    return {row[0]: tuple(row[1:]) for row in rows}


@pytest.fixture
def reaper() -> Iterator[list[bytes]]:
    """Markers of the processes a test starts; any still running are killed after it."""
    markers: list[bytes] = []
    yield markers
    for marker in markers:
        for pid in unit_processes(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["systemd", "kubernetes"])
def test_a_stop_finishes_or_hands_back_every_job_within_the_stop_timeout(
    how: str, dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, reaper: list[bytes]
) -> None:
    launch = scaled_launch(how, dsn, policy_allowing(tmp_path, "/bin/sh"))
    slots = int(launch.env["PGQCTL_CONCURRENCY"])
    queue = launch.env["PGQCTL_QUEUE"]
    assert slots >= 4 and queue == INSTANCE
    go, marks = tmp_path / "go", tmp_path / "started"
    marks.mkdir()
    started = 'echo > "$1/$PGQCTL_JOB_ID"'

    def argv(script: str, *args: str) -> str:
        return json.dumps({"argv": ["sh", "-c", script, "sh", str(marks), *args]})

    # Jobs that end within the grace once they are let go, after the stop
    # began: they must not have been signalled.
    finishing = add_jobs(
        conn, 2, payload=argv(f'{started}; while [ ! -e "$2" ]; do sleep 0.05; done', str(go))
    )
    # A job that ignores SIGTERM: the worker's SIGKILL 5 s later ends it.
    stubborn = add_jobs(conn, 1, payload=argv(f'trap "" TERM; {started}; sleep 120'))
    # Jobs longer than the grace: stopped and handed back.
    long = add_jobs(conn, slots - 3, payload=argv(f"{started}; sleep 120"))
    # Jobs no slot is free for, and one of a queue the instance does not serve.
    waiting = add_jobs(conn, 2, priority=-1)
    other = add_jobs(conn, 1, queue="reports")

    # What the unit's cgroup (the pod) holds: every process with this variable.
    token = uuid.uuid4().hex
    marker = f"DEPLOY_TEST_UNIT={token}".encode()
    reaper.append(marker)
    env = {**launch.env, "HOME": str(tmp_path), "DEPLOY_TEST_UNIT": token}
    env["PYTHONPATH"] = str(REPO_ROOT)  # the tree under test, wherever it runs from
    assert Path(launch.argv[0]).name == "pgqctl"
    command = [sys.executable, "-m", "pgqctl", *launch.argv[1:]]
    log = tmp_path / "worker.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            command, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=err, stderr=err
        )
    try:
        wait_for([marks / str(i) for i in finishing + stubborn + long])
        # The worker, its guard, and a shell and a sleep for most jobs.
        assert len(unit_processes(marker)) >= 2 + slots + 1, "the stand-in cgroup is incomplete"

        def let_go() -> None:
            # The finishing jobs may end once the worker has begun to stop.
            deadline = time.monotonic() + 10
            while "claiming no more jobs" not in log.read_text():
                assert time.monotonic() < deadline, "the worker did not say it is stopping"
                time.sleep(0.02)
            go.touch()

        took, left = stop(proc, launch, marker, then=let_go)
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert proc.returncode == 0, output
    assert took < launch.stop_timeout, f"took {took:.1f}s of {launch.stop_timeout:g}s\n{output}"
    assert took >= TEST_GRACE, "the worker did not wait for its jobs"
    assert left == set(), "processes outlived the worker: systemd's SIGKILL would end them"
    assert "Traceback" not in output

    rows = jobs(conn)
    assert [r for r in rows.values() if r[0] == "running"] == [], output
    for job_id in finishing:
        assert rows[job_id][:2] == ("done", 1), output
    for job_id in stubborn + long:
        # Back in the queue, the interrupted attempt not counted against it.
        assert rows[job_id] == ("pending", 1, 3, None, 1), output
    for job_id in waiting + other:
        assert rows[job_id][:2] == ("pending", 0), output


@pytest.mark.parametrize(
    ("setting", "served"),
    [
        (None, {INSTANCE}),  # the instance's name
        ("PGQCTL_QUEUE='default reports'", {INSTANCE, "reports"}),
        ("PGQCTL_QUEUE=", None),  # set but empty: every queue
    ],
)
def test_an_instance_serves_its_queue_or_what_its_file_says(
    dsn: str,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
    setting: str | None,
    served: set[str] | None,
) -> None:
    files = {DSN_ENV_PATH: replace_setting(DSN_ENV.read_text(), "PGQCTL_DSN", dsn)}
    worker_file = WORKER_ENV.read_text()
    if setting is not None:
        worker_file += setting + "\n"
    files[WORKER_ENV_PATH.format(instance=INSTANCE)] = worker_file
    launch = unit_launch(files)
    queues = [INSTANCE, "reports", "mail"]
    ids = {queue: add_jobs(conn, queue=queue)[0] for queue in queues}
    env = {**launch.env, "HOME": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    env["PGQCTL_POLICY"] = policy_allowing(tmp_path, shutil.which("true") or "/bin/true")
    result = subprocess.run(
        [sys.executable, "-m", "pgqctl", *launch.argv[1:], "--burst"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    rows = jobs(conn)
    done = {queue for queue, job_id in ids.items() if rows[job_id][0] == "done"}
    assert done == (served if served is not None else set(queues)), result.stderr


# -- cron and the CronJobs --------------------------------------------------------------

_FIELDS = [("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12)]
_FIELDS.append(("day of week", 0, 7))


def check_schedule(fields: list[str]) -> None:
    """Five cron time fields, numeric: *, N, N-M, lists, and /steps."""
    assert len(fields) == 5, fields
    for text, (what, low, high) in zip(fields, _FIELDS, strict=True):
        for part in text.split(","):
            base, _, step = part.partition("/")
            assert not step or (step.isdigit() and int(step) > 0), f"{what}: {text}"
            if base == "*":
                continue
            bounds = base.split("-")
            assert len(bounds) <= 2 and all(b.isdigit() for b in bounds), f"{what}: {text}"
            assert all(low <= int(b) <= high for b in bounds), f"{what} out of range: {text}"


@dataclass
class CronLine:
    schedule: list[str]
    user: str
    command: str


def read_crontab(text: str) -> tuple[dict[str, str], list[CronLine]]:
    """A file of /etc/cron.d: its variables and its lines (5 time fields, a
    user, a command)."""
    assert text.endswith("\n"), "cron ignores a last line without a newline"
    env: dict[str, str] = {}
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        assignment = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)", stripped)
        if assignment:
            env[assignment[1]] = assignment[2]
            continue
        *schedule, user, command = stripped.split(None, 6)
        check_schedule(schedule)
        # cron turns an unescaped % into a newline.
        assert "%" not in command, command
        lines.append(CronLine(schedule, user, command))
    return env, lines


def invocation(command: str) -> list[str]:
    """The arguments of the pgqctl a cron command runs, redirections aside."""
    words = shlex.split(command)
    assert words.count("pgqctl") == 1, command
    return [w for w in words[words.index("pgqctl") + 1 :] if not re.match(r"\d*[<>]", w)]


def test_the_cron_file_runs_reap_every_minute_and_purge_nightly() -> None:
    # Installed as /etc/cron.d/pgqctl: cron skips names with a dot.
    assert "/etc/cron.d/pgqctl:" in CRON.read_text()
    env, lines = read_crontab(CRON.read_text())
    assert env["SHELL"] == "/bin/sh"
    program = shlex.split(one(read_unit(UNIT.read_text())["Service"], "ExecStart"))[0]
    # cron finds the pgqctl the workers run.
    assert env["PATH"].split(":")[0] == str(Path(program).parent)
    user = one(read_unit(UNIT.read_text())["Service"], "User")
    assert {line.user for line in lines} == {user}
    pgqctl = [invocation(line.command) for line in lines]
    by_command = {args[0]: line for args, line in zip(pgqctl, lines, strict=True)}
    assert by_command["reap"].schedule == ["*"] * 5
    assert any(a[:1] == ["reap"] and "--quiet" in a for a in pgqctl)
    purges = [(a, line) for a, line in zip(pgqctl, lines, strict=True) if a[0] == "purge"]
    assert purges and all("--older-than" in a for a, _ in purges)
    for _, line in purges:
        minute, hour, *days = line.schedule
        assert minute.isdigit() and hour.isdigit() and days == ["*"] * 3, "nightly"
    for line in lines:
        # Each reads the database from the workers' file, and never overlaps itself.
        assert f". {DSN_ENV_PATH} && " in line.command
        assert " flock -n " in line.command
    found = [re.findall(r"flock -n (\S+)", line.command) for line in lines]
    assert all(len(lock) == 1 for lock in found)
    locks = [lock for [lock] in found]
    assert len(set(locks)) == len(locks)
    assert all(lock.startswith(STATE_DIR + "/") for lock in locks)


def test_the_cronjobs_reap_every_minute_and_purge_nightly() -> None:
    image = deployment()["spec"]["template"]["spec"]["containers"][0]["image"]
    args = []
    for job in cronjobs():
        spec = job["spec"]
        check_schedule(spec["schedule"].split())
        assert spec["concurrencyPolicy"] == "Forbid"
        pod = spec["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["restartPolicy"] in ("Never", "OnFailure")
        [container] = pod["containers"]
        assert container["image"] == image
        dsn_from_secret(container)
        assert container["args"][0] == "pgqctl" and "command" not in container
        args.append((spec["schedule"], container["args"][1:]))
    assert ("* * * * *", ["reap", "--quiet"]) in args
    assert any(a[0] == "purge" and "--older-than" in a for _, a in args)


@pytest.fixture
def finished_history(conn: psycopg.Connection[Any]) -> dict[str, list[int]]:
    """Jobs for reap and purge to act on, and jobs they must leave alone."""
    return {
        "reaped": expired(conn),
        "running": add_jobs(
            conn,
            status="running",
            attempts=1,
            locked_until=ago("-5 minutes"),
            locked_by="host:1:0",
        ),
        "pending": add_jobs(conn),
        "old done": add_jobs(conn, status="done", attempts=1, finished_at=ago("8 days")),
        "recent done": add_jobs(conn, status="done", attempts=1, finished_at=ago("1 day")),
        "old failed": add_jobs(conn, status="failed", attempts=3, finished_at=ago("31 days")),
        "recent failed": add_jobs(conn, status="failed", attempts=3, finished_at=ago("8 days")),
    }


def check_maintenance(conn: psycopg.Connection[Any], history: dict[str, list[int]]) -> None:
    rows = {i: r[0] for i, r in jobs(conn).items()}
    expected = {
        "reaped": "pending",
        "running": "running",
        "pending": "pending",
        "recent done": "done",
        "recent failed": "failed",
    }
    assert {what: rows.get(i) for what, [i] in history.items()} == {
        **expected,
        "old done": None,
        "old failed": None,
    }


def stand_in_bin(tmp_path: Path) -> Path:
    """A directory holding `pgqctl`, run by this interpreter from the tree under test."""
    directory = tmp_path / "bin"
    directory.mkdir(exist_ok=True)
    program = directory / "pgqctl"
    program.write_text(
        "#!/bin/sh\n"
        '[ -n "$PGQCTL_DSN" ] || { echo "stand-in pgqctl: no PGQCTL_DSN" >&2; exit 99; }\n'
        f"PYTHONPATH={shlex.quote(str(REPO_ROOT))} exec {shlex.quote(sys.executable)} -m pgqctl"
        ' "$@"\n'
    )
    program.chmod(0o755)
    return directory


def test_the_cron_lines_run_as_cron_runs_them(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, finished_history: Any
) -> None:
    if shutil.which("flock") is None:
        missing("flock is not installed (Debian: util-linux)")
    program = shlex.split(one(read_unit(UNIT.read_text())["Service"], "ExecStart"))[0]
    env_file = tmp_path / "pgqctl.env"
    env_file.write_text(replace_setting(DSN_ENV.read_text(), "PGQCTL_DSN", dsn))
    state = tmp_path / "state"
    state.mkdir()
    variables, lines = read_crontab(CRON.read_text())
    bin_dir = stand_in_bin(tmp_path)
    env = {"HOME": str(state), "LOGNAME": getpass.getuser(), "PATH": CRON_PATH, "SHELL": "/bin/sh"}
    env.update(variables)
    env["PATH"] = env["PATH"].replace(str(Path(program).parent), str(bin_dir), 1)
    assert env["PATH"].startswith(str(bin_dir))
    for line in lines:
        command = line.command.replace(DSN_ENV_PATH, str(env_file))
        command = command.replace(STATE_DIR + "/", f"{state}/")
        result = subprocess.run(
            [env["SHELL"], "-c", command],
            env=env,
            cwd=state,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, (line.command, result.stderr)
        assert "Traceback" not in result.stderr
    check_maintenance(conn, finished_history)


def test_the_cronjobs_run_as_kubernetes_runs_them(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, finished_history: Any
) -> None:
    bin_dir = stand_in_bin(tmp_path)
    for job in cronjobs():
        [container] = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        args = container["args"]
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **container_env(container, dsn)}
        result = subprocess.run(
            [str(bin_dir / args[0]), *args[1:]],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, (args, result.stderr)
    check_maintenance(conn, finished_history)


# -- Kubernetes -----------------------------------------------------------------------


def test_the_manifests_match_the_kubernetes_schema() -> None:
    validator = need_module("kubernetes_validate", "kubernetes-validate")
    versions = validator.utils.all_versions()
    # The oldest and the newest the package knows: valid in both, valid between.
    for version in (versions[0], versions[-1]):
        for path in (K8S_WORKER, K8S_CRONJOBS, K8S_WEB):
            for doc in load_yaml(path):
                try:
                    validator.validate(doc, version, strict=True)
                except validator.ValidationError as exc:
                    pytest.fail(f"{path.name} ({doc['kind']}), Kubernetes {version}: {exc}")


def test_the_deployment_outlasts_the_grace_and_reads_the_dsn_from_a_secret() -> None:
    doc = deployment()
    pod = doc["spec"]["template"]["spec"]
    [container] = pod["containers"]
    launch = deployment_launch("unused")
    assert launch.grace == DEFAULT_GRACE
    assert launch.stop_timeout >= launch.grace + BEYOND_GRACE, (
        f"terminationGracePeriodSeconds={launch.stop_timeout:g} leaves the worker too little "
        f"time after its {launch.grace:g}s grace: it needs {BEYOND_GRACE:g}s more"
    )
    # SIGTERM starts the graceful stop; a preStop hook would spend the period first.
    assert "lifecycle" not in container
    assert launch.argv == ["pgqctl", "worker"]
    assert "command" not in container, "args alone keep the image's init as its entrypoint"
    dsn_from_secret(container)
    env = container_env(container, "unused")
    assert set(env) - {"PGQCTL_DSN"} <= worker_variables()
    # A container's CPU count is the node's: the concurrency must be given.
    assert int(env["PGQCTL_CONCURRENCY"]) >= 1
    assert env["PGQCTL_QUEUE"] == INSTANCE
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]
    assert pod["enableServiceLinks"] is False
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert doc["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert (
        doc["spec"]["selector"]["matchLabels"].items()
        <= doc["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_web_deployment_serves_its_pages_with_the_token_it_mounts(
    dsn: str, tmp_path: Path, start_pgqctl: Any
) -> None:
    [deployment_doc, service] = load_yaml(K8S_WEB)
    assert (deployment_doc["kind"], service["kind"]) == ("Deployment", "Service")
    pod = deployment_doc["spec"]["template"]["spec"]
    # A Service's variables would land in the PGQCTL_* options (--port...).
    assert pod["enableServiceLinks"] is False
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    dsn_from_secret(container)
    args = container["args"]
    token_path = Path(args[args.index("--token-file") + 1])
    [mount] = container["volumeMounts"]
    [volume] = pod["volumes"]
    assert (Path(mount["mountPath"]), mount["name"]) == (token_path.parent, volume["name"])
    for probe in (container["readinessProbe"], container["livenessProbe"]):
        assert probe["httpGet"]["path"] == "/healthz"
    # The container's command, as Kubernetes runs it: its token file and a
    # free port in place of the mounted Secret and port 8080.
    token = "t" * 32
    (tmp_path / "token").write_text(token + "\n")
    argv = list(args[1:])
    argv[argv.index("--token-file") + 1] = str(tmp_path / "token")
    argv[argv.index("--port") + 1] = "0"
    web = start_pgqctl(*argv, "--dsn", dsn, name="web")
    _, port = web_address(web)  # it binds 0.0.0.0, as in the pod: reached here on 127.0.0.1
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(base + "/healthz", timeout=10) as response:
        assert response.read() == b"ok\n"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(base + "/", timeout=10)
    assert refused.value.code == 401
    asked = urllib.request.Request(base + "/jobs", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(asked, timeout=10) as response:
        assert response.status == 200


# -- what the workers may run ------------------------------------------------------------


def policy_allowing(tmp_path: Path, *programs: str) -> str:
    """A copy of the shipped policy with `programs` as its allowlist (the
    shipped one names /opt/app/bin/, which the test host lacks)."""
    text, count = re.subn(
        r"^programs = .*$",
        f"programs = {json.dumps(list(programs))}",
        POLICY.read_text(),
        flags=re.M,
    )
    assert count == 1, "the shipped policy should set programs on one line"
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return str(path)


def test_the_shipped_policy_parses_and_allows_no_shell_interpreter_or_loader_variable() -> None:
    policy = read_policy(str(POLICY))
    assert policy.programs, "the example must restrict programs"
    assert all(p.startswith("/opt/app/") for p in policy.programs), policy.programs
    for program in ("/bin/sh", sys.executable, shutil.which("env") or "/usr/bin/env"):
        assert policy.program_refusal(program, "/usr/bin:/bin", None) is not None, program
    assert not [name for name in policy.allow_env if is_loader_variable(name)]
    # deploy/README.md installs it where the unit, the cron line and the pod read it.
    assert f"deploy/policy.toml {POLICY_PATH}" in (DEPLOY / "README.md").read_text()


def test_every_worker_the_deploy_files_start_runs_under_the_policy() -> None:
    assert unit_launch(shipped_env_files()).env["PGQCTL_POLICY"] == POLICY_PATH
    for path in (DSN_ENV, WORKER_ENV):
        assert "PGQCTL_POLICY" not in read_env_file(path.read_text()), path

    pod = deployment()["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container_env(container, "unused")["PGQCTL_POLICY"] == POLICY_PATH
    [mount] = [
        m for m in container["volumeMounts"] if m["mountPath"] == str(Path(POLICY_PATH).parent)
    ]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "pgqctl-policy"
    made = "kubectl create configmap pgqctl-policy --from-file=policy.toml=deploy/policy.toml"
    assert made in K8S_WORKER.read_text()

    # Cron runs no worker unless one is uncommented, and that one has the policy too.
    workers = [line for line in CRON.read_text().splitlines() if " pgqctl worker" in line]
    assert workers
    for line in workers:
        assert f"pgqctl worker --burst --policy {POLICY_PATH}" in line, line


@pytest.mark.parametrize("how", ["systemd", "kubernetes", "cron"])
def test_a_worker_started_as_deployed_refuses_what_the_policy_forbids(
    how: str, dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    allowed = tmp_path / "app-bin"
    allowed.mkdir()
    report = allowed / "report"
    report.write_text(f"#!/bin/sh\necho ran > {tmp_path}/ran\n")
    report.chmod(0o755)
    policy = policy_allowing(tmp_path, f"{allowed}/")
    touched = tmp_path / "touched"
    [by_sh] = add_jobs(conn, 1, payload=json.dumps({"argv": ["sh", "-c", f"touch {touched}"]}))
    [preloaded] = add_jobs(
        conn, 1, payload=json.dumps({"argv": [str(report)], "env": {"LD_PRELOAD": ""}})
    )
    [fine] = add_jobs(conn, 1, payload=json.dumps({"argv": [str(report)]}))

    env_file = tmp_path / "pgqctl.env"
    env_file.write_text(replace_setting(DSN_ENV.read_text(), "PGQCTL_DSN", dsn))
    if how == "cron":
        [line] = [line for line in CRON.read_text().splitlines() if " pgqctl worker" in line]
        _, [cron_line] = read_crontab(line.lstrip("#") + "\n")
        command = cron_line.command.replace(DSN_ENV_PATH, str(env_file))
        command = command.replace(STATE_DIR + "/", f"{tmp_path}/").replace(POLICY_PATH, policy)
        bin_dir = stand_in_bin(tmp_path)
        argv = ["/bin/sh", "-c", command]
        env = {"HOME": str(tmp_path), "PATH": f"{bin_dir}:{CRON_PATH}"}
    else:
        if how == "systemd":
            launch = unit_launch({DSN_ENV_PATH: env_file.read_text()})
        else:
            launch = deployment_launch(dsn)
        assert launch.env["PGQCTL_POLICY"] == POLICY_PATH
        env = {**launch.env, "PGQCTL_POLICY": policy, "HOME": str(tmp_path)}
        env["PYTHONPATH"] = str(REPO_ROOT)
        argv = [sys.executable, "-m", "pgqctl", *launch.argv[1:], "--burst"]
    result = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr

    rows = jobs(conn)
    assert rows[fine][:2] == ("done", 1), result.stderr
    assert (tmp_path / "ran").exists() and not touched.exists()
    for job_id in (by_sh, preloaded):
        assert rows[job_id][:2] == ("failed", 1), result.stderr
    errors = dict(conn.execute("SELECT id, last_error FROM jobs").fetchall())
    assert "is not on the policy's allowlist (programs)" in errors[by_sh]
    assert '"env" sets LD_PRELOAD' in errors[preloaded]
