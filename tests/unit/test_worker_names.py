"""How a worker names its connections in pg_stat_activity."""

from __future__ import annotations

from pgqctl.worker import APPLICATION_NAME_BYTES, application_name


def test_a_short_host_is_named_whole() -> None:
    assert application_name("web-1:4180") == "pgqctl worker web-1:4180"


def test_a_long_host_loses_its_domain_first_and_keeps_the_pid() -> None:
    host = "ip-172-31-100-200.eu-west-1.compute.internal"  # 66 bytes named whole
    name = application_name(f"{host}:4194303")
    assert len(name.encode()) <= APPLICATION_NAME_BYTES
    assert name == "pgqctl worker ip-172-31-100-200.eu-west-1.compute:4194303"


def test_a_host_of_one_long_label_is_cut_and_keeps_the_pid() -> None:
    name = application_name("x" * 80 + ":12")
    assert len(name.encode()) == APPLICATION_NAME_BYTES
    assert name.startswith("pgqctl worker xxx") and name.endswith("x:12")
    # A multibyte character is never split.
    name = application_name("é" * 40 + ":12")
    assert len(name.encode()) <= APPLICATION_NAME_BYTES and name.endswith("é:12")
