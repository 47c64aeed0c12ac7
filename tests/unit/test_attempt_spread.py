"""The run and wait times `metrics` gives, from the database's buckets to
Prometheus's cumulative ones, without a database."""

from __future__ import annotations

from pgqctl.monitor import ATTEMPT_BUCKETS, Spread


def test_width_buckets_become_cumulative_counts_under_each_bound() -> None:
    spread = Spread()
    spread.add(0, 3, 0.01)  # under the first bound (10 ms)
    spread.add(ATTEMPT_BUCKETS.index(1.0) + 1, 2, 3.0)  # from 1 s to the next bound
    spread.add(len(ATTEMPT_BUCKETS), 1, 7200.0)  # past the last bound: in +Inf only
    assert spread.below[0] == 3
    assert spread.below[ATTEMPT_BUCKETS.index(1.0)] == 3
    assert spread.below[ATTEMPT_BUCKETS.index(2.5)] == 5
    assert spread.below[-1] == 5
    assert (spread.count, spread.seconds) == (6, 7203.01)
