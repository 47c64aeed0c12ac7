"""How `stats` estimates done jobs on a long history, without a database."""

from __future__ import annotations

import pytest

from pgqctl.admin import Counts, TableEstimate, estimate_done


def test_a_queue_gets_its_share_of_rows_less_its_exact_other_counts() -> None:
    counted = {"a": Counts.of(pending=100, failed=50, done=1001), "b": Counts.of(running=10)}
    table = TableEstimate(rows=10_000, analyzed=True, queue_shares={"a": 0.7, "b": 0.3})
    assert estimate_done(counted, table) == {"a": 6850, "b": 2990}


def test_a_queue_outside_the_common_list_is_not_guessed() -> None:
    # The rest of the rows could all be that queue's, or nearly none: the
    # planner's even spread (400 here) is no count to show.
    table = TableEstimate(10_000, True, {"a": 0.8}, other_share=0.05)
    counted = {"a": Counts.of(done=1001), "rare": Counts.of(pending=100)}
    assert estimate_done(counted, table) == {"a": 8000, "rare": None}


def test_an_estimate_never_falls_below_the_jobs_seen() -> None:
    # Statistics from before a burst of work: the counted jobs are a floor.
    table = TableEstimate(500, True, {"a": 1.0})
    assert estimate_done({"a": Counts.of(done=1001)}, table) == {"a": 1001}


def test_before_any_analyze_a_queue_is_told_only_within_what_is_certain() -> None:
    table = TableEstimate(rows=4100, analyzed=False)
    done = estimate_done({"a": Counts.of(pending=100, done=750), "b": Counts.of(done=251)}, table)
    assert done == {"a": None, "b": None}  # 750 or 3749 for a: no telling
    small = TableEstimate(rows=1400, analyzed=False)
    done = estimate_done({"a": Counts.of(pending=100, done=1001)}, small)
    assert done == {"a": 1300}  # every done job not seen is a's: at most 1300


def test_shares_from_before_a_purge_and_a_load_are_not_trusted() -> None:
    # At the last ANALYZE: "old" held 99% of 20,200 rows (mostly pending), "small"
    # 1%. Since: old ran and was mostly purged, "new" loaded 200,000 done jobs.
    table = TableEstimate(
        rows=201_600, analyzed=True, queue_shares={"old": 0.99, "small": 0.01}, changed=260_000
    )
    counted = {"old": Counts.of(done=401), "small": Counts.of(done=200), "new": Counts.of(done=400)}
    # Before: ~199,584 for old (1,000 in truth), ~0 for new (200,000).
    assert estimate_done(counted, table) == {"old": None, "small": None, "new": None}


def test_fresh_shares_of_a_sample_are_good_to_a_factor_of_2() -> None:
    # 1,000,000 rows, ANALYZE read 30,000 of them; nothing changed since.
    counted = {
        "big": Counts.of(done=700, pending=5_000),
        "mid": Counts.of(done=250),
        "tiny": Counts.of(done=51),
    }
    table = TableEstimate(
        1_000_000, True, {"big": 0.8, "mid": 0.1998, "tiny": 0.0002}, sampled=30_000
    )
    done = estimate_done(counted, table)
    assert done["big"] == pytest.approx(795_000, rel=0.01)
    assert done["mid"] == pytest.approx(199_800, rel=0.01)
    assert done["tiny"] is None  # six rows in the sample: could be 51 or 450


@pytest.mark.parametrize("changed", [0, 5_000, 50_000, 120_000])
def test_a_figure_given_is_within_a_factor_of_2_of_the_truth(changed: int) -> None:
    # Whatever the changes since ANALYZE did (here: the worst, all to one queue).
    for truth_a in (100_000 - changed, 100_000 + changed):
        table = TableEstimate(200_000, True, {"a": 0.5, "b": 0.5}, changed=changed, rest_share=0.0)
        counted = {"a": Counts.of(done=500), "b": Counts.of(done=501)}
        figure = estimate_done(counted, table)["a"]
        assert figure is None or truth_a / 2 <= figure <= 2 * truth_a
