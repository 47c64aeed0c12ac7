"""pgqctl.doctor without a database: which settings count as changed away,
and how the dead tuples a holder keeps are told."""

from __future__ import annotations

from pgqctl import doctor


def table(
    options: dict[str, str], *, dead: int = 0, since: float | None = None
) -> doctor.TableHealth:
    return doctor.TableHealth(
        name="jobs",
        counters={"n_dead_tup": dead, "n_live_tup": 0},
        seconds_since_vacuum=since,
        table_bytes=8192,
        index_bytes=8192,
        options=options,
        bloat=doctor.Bloat("estimate", None, None),
    )


def holder(age: float | None, *, holds: bool = True) -> doctor.Holder:
    return doctor.Holder("transaction", "pid 1", {}, 10, age, holds)


def test_the_recommended_settings_are_not_changed_away() -> None:
    assert doctor._settings_changed(table(dict(doctor.RECOMMENDED))) == []


def test_a_fraction_or_a_threshold_well_above_is_changed_away() -> None:
    options = dict(doctor.RECOMMENDED)
    options["autovacuum_vacuum_scale_factor"] = "0.2"
    options["autovacuum_analyze_threshold"] = str(
        int(doctor.RECOMMENDED["autovacuum_analyze_threshold"]) * (doctor.THRESHOLD_SLACK + 1)
    )
    del options["autovacuum_vacuum_threshold"]
    changed = doctor._settings_changed(table({**options, "autovacuum_enabled": "false"}))
    assert changed[0] == "autovacuum_enabled=false"
    assert "autovacuum_vacuum_scale_factor=0.2" in changed
    assert any(c.startswith("autovacuum_analyze_threshold=") for c in changed)
    assert "autovacuum_vacuum_threshold not set (the server's default applies)" in changed
    # A threshold raised a little is tuning, not a change away.
    options = dict(doctor.RECOMMENDED)
    options["autovacuum_vacuum_threshold"] = str(
        int(doctor.RECOMMENDED["autovacuum_vacuum_threshold"]) * 2
    )
    assert doctor._settings_changed(table(options)) == []


def test_dead_tuples_are_all_kept_when_vacuumed_since_the_holder_began() -> None:
    assert doctor._kept(holder(60.0), [table({}, dead=500, since=10.0)]) == (500, "counted")


def test_dead_tuples_are_a_bound_when_some_died_before_the_holder() -> None:
    assert doctor._kept(holder(60.0), [table({}, dead=500, since=600.0)]) == (500, "at most")
    assert doctor._kept(holder(60.0), [table({}, dead=500, since=None)]) == (500, "at most")
    assert doctor._kept(holder(None), [table({}, dead=500, since=1.0)]) == (500, "at most")


def test_a_holder_of_another_scope_keeps_none() -> None:
    assert doctor._kept(holder(60.0, holds=False), [table({}, dead=500)]) == (0, "counted")


def test_every_table_a_migration_creates_is_examined() -> None:
    names = doctor.queue_tables()
    assert {"jobs", "paused_queues", "pgqctl_migrations"} <= set(names)
