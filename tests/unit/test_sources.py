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
