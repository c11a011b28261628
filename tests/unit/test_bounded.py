"""Reads off the caller's thread: a slow read keeps its fact at the last value read until it
is stuck (STUCK_AFTER), a stuck one is named, and neither holds the caller past its deadline
once the fact has a value."""

from __future__ import annotations

import threading
import time

import pytest

from nodeagent.io.bounded import BoundedReads, Stuck, Where


class Driver:
    """A fact whose read takes `delay` seconds, or blocks while `held` is set."""

    def __init__(self) -> None:
        self.value = 1
        self.delay = 0.0
        self.held = threading.Event()
        self.reads = 0
        self.returned = 0

    def read(self, where: Where) -> int:
        where.path = "gids/3"
        self.reads += 1
        value = self.value
        time.sleep(self.delay)
        while self.held.is_set():
            time.sleep(0.01)
        self.returned += 1
        return value


def test_a_slow_read_answers_with_the_last_value_and_then_with_its_own() -> None:
    reads, driver = BoundedReads(deadline=0.1, stuck_after=2.0), Driver()
    assert reads.one("gid", driver.read) == 1
    driver.value, driver.delay = 2, 1.0
    assert reads.one("gid", driver.read) == 1, "slow, not stuck: the fact as last read"
    assert driver.returned == 1, "the caller did not wait for the slow read"
    time.sleep(1.1)  # the slow read has returned meanwhile
    driver.delay = 0.0
    assert reads.one("gid", driver.read) == 2
    assert driver.reads == 3


def test_a_read_still_running_is_not_started_again_and_is_stuck_after_its_limit() -> None:
    reads, driver = BoundedReads(deadline=0.05, stuck_after=0.6), Driver()
    assert reads.one("gid", driver.read) == 1
    driver.held.set()
    assert reads.one("gid", driver.read) == 1
    assert reads.one("gid", driver.read) == 1  # the same read, still running
    time.sleep(0.6)
    got = reads.one("gid", driver.read)
    assert isinstance(got, Stuck) and got.seconds >= 0.6 and got.path == "gids/3", got
    assert "read of gid at gids/3 has not returned" in got.describe()
    assert driver.reads == 2, "one wedged read costs one thread, never a pile"
    driver.held.clear()
    time.sleep(0.05)
    assert reads.one("gid", driver.read) == 1


def test_a_first_read_has_no_last_value_so_it_is_waited_for_until_stuck() -> None:
    reads, driver = BoundedReads(deadline=0.05, stuck_after=1.0), Driver()
    driver.delay = 0.3
    assert reads.one("gid", driver.read) == 1, "slow first read: its own answer"
    other = Driver()
    other.held.set()
    started = time.monotonic()
    got = reads.one("other", other.read)
    assert isinstance(got, Stuck) and time.monotonic() - started >= 1.0
    other.held.clear()


def test_an_error_is_raised_in_the_callers_thread_and_forgets_the_last_value() -> None:
    reads = BoundedReads(deadline=0.05, stuck_after=0.5)
    assert reads.one("gid", lambda w: 1) == 1

    def broken(where: Where) -> int:
        raise OSError("EIO")

    with pytest.raises(OSError, match="EIO"):
        reads.one("gid", broken)
    held = Driver()
    held.held.set()
    got = reads.one("gid", held.read)  # no last value now: waited for until stuck
    assert isinstance(got, Stuck)
    held.held.clear()


def test_a_waiting_caller_keeps_its_hook_called() -> None:
    reads, driver = BoundedReads(deadline=0.1, stuck_after=1.0), Driver()
    calls = []
    reads.while_waiting = lambda: calls.append(1)
    driver.delay = 0.2
    assert reads.one("gid", driver.read) == 1
    assert len(calls) > 5, "the daemon repairs while it waits for a first read"
