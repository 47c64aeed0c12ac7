"""Connection resolution order and password-free descriptions."""

from __future__ import annotations

import pytest

from pgqctl.config import describe, resolve_target
from pgqctl.errors import BadInput


def test_flag_beats_every_environment_variable() -> None:
    env = {"PGQCTL_DSN": "dbname=a", "DATABASE_URL": "dbname=b", "PGHOST": "c"}
    target = resolve_target("dbname=flag", env)
    assert (target.dsn, target.source) == ("dbname=flag", "--dsn")


def test_pgqctl_dsn_beats_database_url_beats_libpq() -> None:
    env = {"PGQCTL_DSN": "dbname=a", "DATABASE_URL": "dbname=b", "PGHOST": "c"}
    assert resolve_target(None, env).source == "PGQCTL_DSN"
    del env["PGQCTL_DSN"]
    assert resolve_target(None, env).dsn == "dbname=b"
    del env["DATABASE_URL"]
    target = resolve_target(None, env)
    assert (target.dsn, target.source) == ("", "libpq environment")


@pytest.mark.parametrize("var", ["PGHOST", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE"])
def test_any_libpq_selector_means_libpq(var: str) -> None:
    assert resolve_target(None, {var: "5433"}).source == "libpq environment"


def test_nothing_configured_means_embedded() -> None:
    target = resolve_target(None, {"HOME": "/root", "PGQCTL_SCHEMA": "x", "PGHOST": ""})
    assert target.embedded
    assert target.dsn is None


def test_invalid_connection_string_is_bad_input_without_its_text() -> None:
    with pytest.raises(BadInput) as err:
        resolve_target("password=topsecret nonsense", {})
    assert "topsecret" not in str(err.value)
    assert err.value.exit_code == 2


@pytest.mark.parametrize(
    "dsn, expected",
    [
        ("postgresql://bob:pw123@db.example:6543/queue", "bob@db.example:6543/queue"),
        ("host=/run/pg user=ann password=pw123 dbname=q", "ann@socket /run/pg:5432/q"),
    ],
)
def test_describe_never_shows_the_password(dsn: str, expected: str) -> None:
    assert describe(dsn) == expected
    assert "pw123" not in describe(dsn)
