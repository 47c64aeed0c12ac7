"""How `stats` estimates done jobs on a long history, without a database."""

from __future__ import annotations

from pgqctl.admin import Counts, TableEstimate, estimate_done


def test_a_queue_gets_its_share_of_rows_less_its_exact_other_counts() -> None:
    counted = {"a": Counts.of(pending=100, failed=50, done=1001), "b": Counts.of(running=10)}
    table = TableEstimate(rows=10_000, analyzed=True, queue_shares={"a": 0.7, "b": 0.3})
    assert estimate_done(counted, table) == {"a": 6850, "b": 2990}


def test_queues_outside_the_common_list_share_the_rest_evenly() -> None:
    table = TableEstimate(10_000, True, {"a": 0.8}, other_share=0.05)
    counted = {"a": Counts.of(done=1001), "rare": Counts.of(pending=100)}
    assert estimate_done(counted, table) == {
        "a": 8000,
        "rare": 400,
    }


def test_an_estimate_never_falls_below_the_jobs_seen() -> None:
    # Statistics from before a burst of work: the counted jobs are a floor.
    table = TableEstimate(500, True, {"a": 1.0})
    assert estimate_done({"a": Counts.of(done=1001)}, table) == {"a": 1001}


def test_before_any_analyze_the_sample_splits_the_estimated_total() -> None:
    table = TableEstimate(rows=4100, analyzed=False)
    done = estimate_done({"a": Counts.of(pending=100, done=750), "b": Counts.of(done=251)}, table)
    assert done == {"a": 2997, "b": 1003}
