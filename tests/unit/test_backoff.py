"""Jittered retry waits: agents that lose the API server together must not retry together."""

from __future__ import annotations

from nodeagent.kube.backoff import Backoff


def test_waits_are_random_below_a_growing_bound_and_capped() -> None:
    # A thousand agents' first five retries after one outage.
    waits = [[b.next() for _ in range(5)] for b in (Backoff(0.5, 30.0) for _ in range(1000))]
    for attempt, bound in enumerate((0.5, 1.0, 2.0, 4.0, 8.0)):
        column = [w[attempt] for w in waits]
        assert all(0.0 <= w <= bound for w in column), (attempt, max(column))
        assert len({round(w, 6) for w in column}) > 900, "no lockstep: the waits differ"
        assert max(column) > 0.9 * bound and min(column) < 0.1 * bound  # spread over it all
    b = Backoff(0.5, 30.0)
    assert max(b.next() for _ in range(50)) <= 30.0  # capped however long it fails
    b.reset()
    assert b.next() <= 0.5  # a success starts afresh
