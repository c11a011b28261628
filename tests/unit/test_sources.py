"""The sources' one contract: start -> typed observations through `deliver` -> stop."""

from __future__ import annotations

import logging
import os
import queue
import threading
from pathlib import Path

import pytest

from nodeagent.io.periodic import Periodic
from nodeagent.run.gidwatch import GidSlotWatcher
from nodeagent.run.work import GidSlotsMoved, Work
from tests.kit.helpers import gid_text, make_gid_tree, roce_entries, wait_for


def test_the_gid_slot_source_delivers_a_move_and_nothing_else(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    make_gid_tree(sysfs, "mlx5_0", roce_entries("r0", "10.10.0.5"))
    got: queue.SimpleQueue[Work] = queue.SimpleQueue()
    watcher = GidSlotWatcher(sysfs, got.put, interval=0.02)
    watcher.retarget([("mlx5_0", 1, 3)])
    watcher.start()
    try:
        looked = watcher.turns
        wait_for(lambda: watcher.turns >= looked + 5, what="a few looks at the slot")
        assert got.empty(), "an unchanged slot delivers nothing"
        slot = sysfs / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "gids" / "3"
        slot.write_text(gid_text("::ffff:10.10.0.99") + "\n")  # changed in place: no event at all
        assert isinstance(got.get(timeout=5), GidSlotsMoved)
    finally:
        watcher.stop()
        watcher.join(timeout=5)
    assert not watcher.is_alive(), "stop() ends the source"


def _open_fds() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}


def test_the_gid_slot_source_sees_a_slot_replaced_or_removed_under_its_kept_file(
    tmp_path: Path,
) -> None:
    """Each slot is kept open between turns; a fixture tree (or anything not sysfs) can
    replace or unlink the file under it, and the source still sees the change. Its
    descriptors are closed when the slot leaves the watch and when the source stops."""
    sysfs = tmp_path / "sys"
    make_gid_tree(sysfs, "mlx5_0", roce_entries("r0", "10.10.0.5"))
    gids = sysfs / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "gids"
    got: queue.SimpleQueue[Work] = queue.SimpleQueue()
    watcher = GidSlotWatcher(sysfs, got.put, interval=0.02)
    watcher.retarget([("mlx5_0", 1, 3), ("mlx5_0", 1, 2)])
    watcher.start()
    try:
        wait_for(lambda: {str(gids / "3"), str(gids / "2")} <= _open_fds(),
                 what="both slots kept open")
        new = tmp_path / "new"
        new.write_text(gid_text("::ffff:10.10.0.77") + "\n")
        os.replace(new, gids / "3")  # a new file at the path: the kept one is unlinked
        assert isinstance(got.get(timeout=5), GidSlotsMoved)
        (gids / "3").unlink()
        assert isinstance(got.get(timeout=5), GidSlotsMoved)
        watcher.retarget([("mlx5_0", 1, 3)])
        wait_for(lambda: str(gids / "2") not in _open_fds(), what="slot 2 closed once unwatched")
    finally:
        watcher.stop()
        watcher.join(timeout=5)
    assert not any(p.startswith(str(gids)) for p in _open_fds()), "every slot closed at stop"


def test_work_taken_during_a_pass_reaches_the_loop_in_order() -> None:
    """take_urgent (between a pass's stages) repairs deletions at once; everything it takes
    off the queue, a stop request included, still reaches the loop, in arrival order."""
    from nodeagent.config import parse_config
    from nodeagent.model.network import EventKind, KernelEvent
    from nodeagent.run.agent import Agent
    from nodeagent.run.work import NetlinkEvent, NodeChanged, StopAsked

    cfg = parse_config({})
    agent = Agent(cfg, reload=lambda: cfg)
    link = NetlinkEvent(KernelEvent(EventKind.LINK, index=9, ifname="eth9"))
    for item in (NodeChanged(), link, StopAsked()):
        agent.work.put(item)
    agent.take_urgent()
    assert agent.work.empty()
    agent.work.put(NodeChanged())  # arrives after the pass: after what was taken
    got = [agent.work.next(0.0) for _ in range(5)]
    assert [type(g[0]).__name__ if g else None for g in got] == [
        "NodeChanged", "NetlinkEvent", "StopAsked", "NodeChanged", None]
    assert all(g is None or g[1] is False for g in got), "nothing here was a deletion"


class _Turns(Periodic):
    """A source whose turn blocks until the test lets it go, then asks for a long pause."""

    def __init__(self, fail_first: bool = False) -> None:
        super().__init__("test-source")
        self.entered = threading.Semaphore(0)
        self.go = threading.Event()
        self.fail_first = fail_first

    def turn(self) -> float:
        self.entered.release()
        self.go.wait(5)
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError("a probe's bug")
        return 3600.0

    def after_failure(self) -> float:
        return 0.0


def test_a_wake_during_a_turn_asks_for_one_more_and_stop_ends_a_long_pause() -> None:
    source = _Turns()
    source.start()
    try:
        assert source.entered.acquire(timeout=5)
        source.wake()  # while the turn runs: what it read may be older than the wake
        source.go.set()
        assert source.entered.acquire(timeout=5), "a second turn, not an hour's pause"
        assert not source.entered.acquire(timeout=0.3), "one wake: one more turn"
    finally:
        source.stop()
        source.join(timeout=5)
    assert not source.is_alive(), "stop() ends the pause"
    assert source.turns == 2


def test_a_turn_that_raises_is_logged_and_the_source_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = _Turns(fail_first=True)
    source.go.set()
    with caplog.at_level(logging.ERROR):
        source.start()
        try:
            assert source.entered.acquire(timeout=5)
            assert source.entered.acquire(timeout=5), "the turn after the failure"
        finally:
            source.stop()
            source.join(timeout=5)
    assert "test-source failed: a probe's bug" in caplog.text
