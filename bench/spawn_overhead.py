"""What running a child through `pgqctl.runner` costs, against plain subprocess.

Spawns `true` in a loop from N threads (default 4), for each way, in rounds
that interleave the ways (in reverse order every other round) so machine
noise hits them alike, and prints the median spawns/s of each and the median
of the per-round ratios, then CPU (parent and children) per spawn, which
other tenants of the machine disturb less:

    python bench/spawn_overhead.py [--threads 4] [--seconds 1] [--rounds 7]

- subprocess_run: each thread calls subprocess.run(["true"]).
- runner_run: each thread does what the worker does per job: parse the payload
  with command_for_job, build child_environment (from a snapshot of the
  worker's environment), make a Stop, and run() (tests/support/runner_helpers.py:
  the engine's one-child path, on the calling thread).
- runner_run_bare: run() alone, no Stop and the environment reused.
- supervisor: what the worker does: one runner.Supervisor thread keeps N
  children running (the payload parsed and the environment built per job,
  each with its Stop), the main thread submitting a new one as each ends.
"""

from __future__ import annotations

import argparse
import functools
import os
import queue
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pgqctl import payload, runner
from tests.support.runner_helpers import child_environment, run


def subprocess_run() -> None:
    subprocess.run(["true"], check=False)


# The worker takes its environment once, as this does: reading os.environ
# decodes every variable on each pass.
_WORKER_ENV = dict(os.environ)


def runner_run() -> None:
    command = payload.command_for_job(
        {"argv": ["true"]}, kind="noop", handlers={}, allow_shell=False, default_timeout=60.0
    )
    env = child_environment(
        _WORKER_ENV, job_id=1, kind="noop", queue="default", attempt=1, extra=command.env
    )
    outcome = run(command, env, stop=runner.Stop())
    assert outcome.succeeded, outcome.describe()


_BARE_COMMAND = runner.Command(("true",))


def runner_run_bare() -> None:
    run(_BARE_COMMAND, _WORKER_ENV)


def measure_supervisor(threads: int, seconds: float) -> tuple[float, float]:
    """As `measure`, with one Supervisor keeping `threads` children running."""
    ended: queue.SimpleQueue[object] = queue.SimpleQueue()
    supervisor = runner.Supervisor(lambda key, outcome, error: ended.put(outcome))

    def submit() -> None:
        command = payload.command_for_job(
            {"argv": ["true"]}, kind="noop", handlers={}, allow_shell=False, default_timeout=60.0
        )
        env = child_environment(
            _WORKER_ENV, job_id=1, kind="noop", queue="default", attempt=1, extra=command.env
        )
        supervisor.submit(None, command, env, stop=runner.Stop())

    cpu = cpu_seconds()
    began = time.monotonic()
    end_at = began + seconds
    for _ in range(threads):
        submit()
    spawns = running = threads
    while running:
        ended.get()
        running -= 1
        if time.monotonic() < end_at:
            submit()
            spawns += 1
            running += 1
    rate = spawns / (time.monotonic() - began)
    per_spawn = (cpu_seconds() - cpu) / spawns * 1e6
    supervisor.close()
    return rate, per_spawn


def cpu_seconds() -> float:
    """CPU used so far by this process and its reaped children, user and system."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def measure(job: Callable[[], None], threads: int, seconds: float) -> tuple[float, float]:
    """Spawns per second, and CPU microseconds per spawn (parent and child)."""
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    end_at = 0.0

    def loop(slot: int) -> None:
        start.wait()
        done = 0
        while time.monotonic() < end_at:
            job()
            done += 1
        counts[slot] = done

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    cpu = cpu_seconds()
    began = time.monotonic()
    end_at = began + seconds
    start.wait()
    for thread in pool:
        thread.join()
    spawns = sum(counts)
    return spawns / (time.monotonic() - began), (cpu_seconds() - cpu) / spawns * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    ways: dict[str, Callable[[], tuple[float, float]]] = {
        name: functools.partial(measure, job, args.threads, args.seconds)
        for name, job in (
            ("subprocess_run", subprocess_run),
            ("runner_run", runner_run),
            ("runner_run_bare", runner_run_bare),
        )
    }
    ways["supervisor"] = functools.partial(measure_supervisor, args.threads, args.seconds)
    for job in (subprocess_run, runner_run, runner_run_bare):  # warm up imports and caches
        job()
    results: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    for round_number in range(args.rounds):
        # Odd rounds run the ways in reverse, so no way always goes first.
        order = list(ways.items())
        for name, way in order if round_number % 2 == 0 else reversed(order):
            rate, cpu_per_spawn = way()
            results[name].append(rate)
            cpu[name].append(cpu_per_spawn)

    median = {name: statistics.median(values) for name, values in results.items()}
    print(f"cpus: {os.cpu_count()} cores")
    print(f"threads: {args.threads} threads")
    for name, value in median.items():
        rounds = ", ".join(f"{v:.0f}" for v in results[name])
        print(f"{name}: {value:.0f} spawns/s (rounds: {rounds})")
    # CPU per spawn moves less than the rate when other work shares the machine.
    for name, values in cpu.items():
        print(f"{name}_cpu: {statistics.median(values):.0f} us/spawn")
    # Each round measures the ways back to back, so a per-round ratio cancels
    # most of the machine's drift; the median of those is the figure to quote.
    for name in ("runner_run", "runner_run_bare", "supervisor"):
        paired = statistics.median(
            mine / base for mine, base in zip(results[name], results["subprocess_run"], strict=True)
        )
        print(f"ratio {name}/subprocess_run: {paired:.2f} x")
        base_cpu = statistics.median(cpu["subprocess_run"])
        print(f"cpu ratio subprocess_run/{name}: {base_cpu / statistics.median(cpu[name]):.2f} x")


if __name__ == "__main__":
    main()
