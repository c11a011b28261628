"""The sources' one contract: start -> typed observations through `deliver` -> stop."""

from __future__ import annotations

import queue
from pathlib import Path

from nodeagent.run.gidwatch import GidSlotWatcher
from nodeagent.run.work import GidSlotsMoved, Work
from tests.kit.helpers import gid_text, make_gid_tree, roce_entries, wait_for


def test_the_gid_slot_source_delivers_a_move_and_nothing_else(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    make_gid_tree(sysfs, "mlx5_0", roce_entries("r0", "10.10.0.5"))
    got: queue.SimpleQueue[Work] = queue.SimpleQueue()
    watcher = GidSlotWatcher(sysfs, got.put, interval=0.02)
    watcher.watch([("mlx5_0", 1, 3)])
    watcher.start()
    try:
        looked = watcher.looks
        wait_for(lambda: watcher.looks >= looked + 5, what="a few looks at the slot")
        assert got.empty(), "an unchanged slot delivers nothing"
        slot = sysfs / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "gids" / "3"
        slot.write_text(gid_text("::ffff:10.10.0.99") + "\n")  # changed in place: no event at all
        assert isinstance(got.get(timeout=5), GidSlotsMoved)
    finally:
        watcher.stop()
        watcher.join(timeout=5)
    assert not watcher.is_alive(), "stop() ends the source"


def test_work_taken_during_a_pass_reaches_the_loop_in_order() -> None:
    """take_urgent (between a pass's stages) repairs deletions at once; everything it takes
    off the queue, a stop request included, still reaches the loop, in arrival order."""
    from nodeagent.config import parse_config
    from nodeagent.run.agent import Agent
    from nodeagent.run.work import NetlinkEvent, NodeChanged, StopAsked

    cfg = parse_config({})
    agent = Agent(cfg, reload=lambda: cfg)
    link = NetlinkEvent({"event": "RTM_NEWLINK", "ifname": "eth9", "index": 9})
    for item in (NodeChanged(), link, StopAsked()):
        agent.work.put(item)
    agent.take_urgent()
    assert agent.work.empty()
    agent.work.put(NodeChanged())  # arrives after the pass: after what was taken
    got = [agent.work.next(0.0) for _ in range(5)]
    assert [type(g[0]).__name__ if g else None for g in got] == [
        "NodeChanged", "NetlinkEvent", "StopAsked", "NodeChanged", None]
    assert all(g is None or g[1] is False for g in got), "nothing here was a deletion"
