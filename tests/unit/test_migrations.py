"""What every migration file declares (docs/commands/migrate.md: Writing a
migration), checked without a database."""

from __future__ import annotations

import pytest

from pgqctl.errors import MigrationError
from pgqctl.migrate import EARLIER_CHECKSUMS, outside_statement
from pgqctl.sql import WRITER_BLOCKING_LOCKS, Migration, migrations


@pytest.mark.parametrize("migration", migrations(), ids=lambda m: m.name)
def test_each_migration_declares_its_compatibility_and_steps(migration: Migration) -> None:
    assert migration.compatibility in ("additive", "breaking")
    assert all(step.declared for step in migration.steps)


@pytest.mark.parametrize("migration", migrations(), ids=lambda m: m.name)
def test_no_step_makes_writers_wait_while_it_reads_a_table(migration: Migration) -> None:
    for step in migration.steps:
        assert not (step.reads and step.blocks_writers()), step.text
        if not step.in_transaction:
            # No lock timeout outside a transaction: only locks writers pass.
            assert not {mode for _, mode in step.locks} & WRITER_BLOCKING_LOCKS
            assert "pgqctl" in outside_statement(step.text, "pgqctl").as_string(None)


def test_earlier_checksums_name_existing_migrations() -> None:
    names = {m.name for m in migrations()}
    assert set(EARLIER_CHECKSUMS) <= names


def test_a_step_outside_a_transaction_runs_one_index_statement_only() -> None:
    text = "CREATE INDEX CONCURRENTLY x_idx ON jobs (id);\nDROP TABLE jobs;\n"
    with pytest.raises(MigrationError, match="only be one CREATE INDEX CONCURRENTLY"):
        outside_statement(text, "public")
    made = outside_statement("-- why\nCREATE INDEX CONCURRENTLY x_idx ON jobs (id);\n", "a b")
    assert made.as_string(None) == 'CREATE INDEX CONCURRENTLY x_idx ON "a b"."jobs" (id);'


def test_steps_are_read_from_the_step_lines() -> None:
    text = (
        "-- compatibility: additive\n-- why\n"
        "-- step: transaction; locks jobs ACCESS EXCLUSIVE\nALTER TABLE jobs ADD COLUMN x int;\n"
        "-- step: no transaction; locks jobs SHARE UPDATE EXCLUSIVE; reads jobs\n"
        "CREATE INDEX CONCURRENTLY x_idx ON jobs (x);\n"
    )
    first, second = Migration(10, "0010_x.sql", text).steps
    assert (first.in_transaction, first.locks, first.reads) == (
        True,
        (("jobs", "ACCESS EXCLUSIVE"),),
        (),
    )
    assert (second.in_transaction, second.reads) == (False, ("jobs",))
    undeclared = Migration(11, "0011_y.sql", "ALTER TABLE jobs ADD COLUMN y int;\n")
    assert undeclared.breaking and not undeclared.steps[0].declared
