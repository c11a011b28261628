"""A wedged driver attribute costs only its own fact: the daemon keeps repairing.

The rails' sysfs root is a real FUSE filesystem (blockingfs.py) mirroring a fixture tree;
reads of one RDMA device's GID slot block while a hold file exists, as a firmware command
that never completes does on real hardware.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit.helpers import (
    Netns,
    condition,
    cpu_load,
    daemon_log,
    fuse_mount,
    read_status,
    stop_daemon,
    wait_for,
    write_config,
)

HERE = Path(__file__).parent
BLOCKED = "class/infiniband/mlx5_1/ports/1/gids/3"


@pytest.fixture
def blocking_sysfs(agent_config: dict[str, Any], tmp_path: Path) -> Iterator[Path]:
    """agent_config's fixture sysfs tree served through FUSE; the hold file is returned."""
    backing = Path(agent_config["paths"]["sysfs"])
    mnt = tmp_path / "fuse-sys"
    mnt.mkdir()
    hold = tmp_path / "hold"
    hold.touch()  # blocking from the start: the daemon's very first pass meets it
    with fuse_mount([sys.executable, str(HERE / "blockingfs.py"), str(backing), str(mnt),
                     str(hold), BLOCKED], mnt, tmp_path / "blockingfs.log",
                    release=lambda: hold.unlink(missing_ok=True)):
        agent_config["paths"]["sysfs"] = str(mnt)
        yield hold


def test_a_blocking_gid_read_costs_its_own_fact_not_the_repairs(
    rails_ns: Netns, agent_config: dict[str, Any], blocking_sysfs: Path, tmp_path: Path
) -> None:
    agent_config["resync_interval"] = "2s"  # passes keep coming while the read is stuck
    run = Path(agent_config["runtime_dir"])
    path = write_config(tmp_path / "c.yaml", agent_config)
    proc = rails_ns.start_daemon(path)

    def gid() -> dict[str, Any] | None:
        data = read_status(run)
        return condition(data, "RoCEGIDStable") if data else None

    # The first pass finishes although mlx5_1's slot 3 never answers: rail1's fact is
    # Unknown, with the path named; rail0's GID is judged as usual.
    got = wait_for(lambda: gid() if (gid() or {}).get("status") == "Unknown" else None,
                   timeout=20, what="RoCEGIDStable Unknown for the wedged device")
    assert proc.poll() is None, daemon_log(proc)
    assert got["reason"] == "GIDTableUnreadable", got
    assert "rail1 r1" in got["message"] and BLOCKED in got["message"], got
    assert "rail0" not in got["message"], got

    # Repairs go on while it stays stuck (several passes have come and gone since).
    for _ in range(3):
        rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0")
        wait_for(lambda: rails_ns.addresses("r0") == ["10.10.0.5/24"], timeout=5,
                 what="address restored while a driver read is stuck")
    # The pass after the last repair verifies the rail (its status may be a moment behind).
    data = wait_for(lambda: (d := read_status(run)) and condition(
        d, "RoCENetworkReady")["status"] == "True" and d, timeout=5,
        what="RoCENetworkReady True after the repairs")
    assert any(BLOCKED in e for e in data["errors"]), data["errors"]

    # Released: the stuck read returns, the next pass reads the table, all True again.
    blocking_sysfs.unlink()
    wait_for(lambda: (read_status(run) or {}).get("ok") is True, timeout=20,
             what="fabric ready once the driver answers")
    code, out = stop_daemon(proc)
    assert code == 0, out


def test_a_slow_gid_read_under_load_keeps_the_verdict_until_it_is_stuck(
    rails_ns: Netns, agent_config: dict[str, Any], blocking_sysfs: Path, tmp_path: Path
) -> None:
    """A read slower than the pass's deadline (0.5 s) but far from stuck (5 s), on a host
    whose every core is busy: the GID verdict stays True (the fact as last read), no read is
    called stuck. Wedged for good, the same read makes the fact Unknown; released, True.
    (Before: any read past 0.5 s made RoCEGIDStable Unknown, a false taint; lab 2a under
    load.)"""
    blocking_sysfs.unlink()  # healthy to start with
    agent_config["resync_interval"] = "1s"  # a full re-read of the table every second
    run = Path(agent_config["runtime_dir"])
    proc = rails_ns.start_daemon(write_config(tmp_path / "c.yaml", agent_config))
    wait_for(lambda: (read_status(run) or {}).get("ok") is True, timeout=20,
             what="first healthy pass")

    blocking_sysfs.write_text("1.5")  # every read of mlx5_1's slot 3 now takes 1.5 s
    seen: list[dict[str, Any]] = []
    with cpu_load():
        passes = read_status(run)["daemon"]["passes"]  # type: ignore[index]
        while len(seen) < 40 or seen[-1]["daemon"]["passes"] < passes + 5:
            data = read_status(run)
            if data:
                seen.append(data)
            assert len(seen) < 2000, "the daemon stopped passing"
            time.sleep(0.1)
    assert proc.poll() is None, daemon_log(proc)
    verdicts = {(condition(d, "RoCEGIDStable")["status"], condition(d, "RoCEGIDStable")
                 ["reason"]) for d in seen}
    assert verdicts == {("True", "GIDsPinned")}, verdicts
    assert not any(BLOCKED in e for d in seen for e in d["errors"]), seen[-1]["errors"]

    blocking_sysfs.write_text("")  # wedged: the fact goes Unknown once the read is stuck
    def unknown() -> dict[str, Any] | None:
        data = read_status(run)
        got = condition(data, "RoCEGIDStable") if data else None
        return got if got and got["status"] == "Unknown" else None

    got = wait_for(unknown, timeout=30, what="RoCEGIDStable Unknown once the read is stuck")
    assert BLOCKED in got["message"] and "rail1 r1" in got["message"], got
    blocking_sysfs.unlink()
    wait_for(lambda: (read_status(run) or {}).get("ok") is True, timeout=20,
             what="fabric ready once the driver answers")
    code, out = stop_daemon(proc)
    assert code == 0, out


def test_a_reload_whose_config_read_blocks_never_stops_the_repairs(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    """SIGHUP while the config sits on a filesystem that does not answer: the read waits on
    its own thread; the loop goes on repairing and says so; released, the reload lands."""
    backing = tmp_path / "etc"
    backing.mkdir()
    write_config(backing / "c.yaml", agent_config)
    mnt = tmp_path / "fuse-etc"
    mnt.mkdir()
    hold = tmp_path / "hold-config"
    with fuse_mount([sys.executable, str(HERE / "blockingfs.py"), str(backing), str(mnt),
                     str(hold), "c.yaml"], mnt, tmp_path / "blockingfs-etc.log",
                    release=lambda: hold.unlink(missing_ok=True)):
        run = Path(agent_config["runtime_dir"])
        link = tmp_path / "c.yaml"  # the daemon's log goes beside it, not onto the FUSE fs
        link.symlink_to(mnt / "c.yaml")
        proc = rails_ns.start_daemon(link)
        wait_for(lambda: (read_status(run) or {}).get("ok") is True, timeout=20,
                 what="first healthy pass")
        hold.touch()
        agent_config["rails"][1]["mtu"] = 9000
        write_config(backing / "c.yaml", agent_config)  # what the reload will find
        proc.send_signal(signal.SIGHUP)
        for _ in range(3):
            rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0")
            wait_for(lambda: rails_ns.addresses("r0") == ["10.10.0.5/24"], timeout=5,
                     what="address restored while the reload's read is stuck")
        data = wait_for(lambda: (d := read_status(run)) and "reading the config"
                        in (d["daemon"].get("reload_error") or "") and d, timeout=15,
                        what="the stuck reload reported")
        assert data["ok"] is True, data
        hold.unlink()
        wait_for(lambda: rails_ns.link("r1")["mtu"] == 9000, timeout=10,
                 what="the reload lands once the read returns")
        wait_for(lambda: (read_status(run) or {}).get("daemon", {}).get("reload_error", 1)
                 is None, what="the error cleared")
        code, out = stop_daemon(proc)
        assert code == 0, out
