"""A real hung filesystem (FUSE, statfs blocks): the agent reports it and never hangs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hungmount import HungMount, stuck_probes

from nodeagent.config import parse_config
from nodeagent.io.commands import BoundedRunner
from nodeagent.run.lustre import look
from tests.kit.helpers import Netns, condition, read_status, stop_daemon, wait_for, write_config


def check(cfg_path: Path) -> tuple[int, dict[str, Any], float]:
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "nodeagent", "check", "--json", "--config",
                          str(cfg_path)], capture_output=True, text=True, timeout=60)
    return res.returncode, json.loads(res.stdout), time.monotonic() - t0


def test_healthy_then_hung_then_released(hung_mount: HungMount, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", {
        "node_name": "n", "runtime_dir": str(tmp_path / "run"),
        "state_dir": str(tmp_path / "state"), "lustre": [hung_mount.lustre_config("1s")]})
    code, out, _ = check(cfg)
    assert code == 0, out
    assert condition(out, "LustreReady")["reason"] == "MountsHealthy"

    hung_mount.hang()
    code, out, elapsed = check(cfg)
    lustre = condition(out, "LustreReady")
    assert code == 1 and (lustre["status"], lustre["reason"]) == ("False", "MountHung")
    assert lustre["message"].startswith(f"{hung_mount.mountpoint}: statfs no answer after 1.")
    assert elapsed < 1.0 + 10  # returned at all: a hang guard, not a speed goal

    hung_mount.release()
    wait_for(lambda: check(cfg)[1]["ok"], what="LustreReady True after release")


def test_a_stuck_probe_is_never_doubled(hung_mount: HungMount) -> None:
    cfg = parse_config({"lustre": [hung_mount.lustre_config("0.3s")]})
    runner = BoundedRunner()
    hung_mount.hang()
    first = look(cfg, runner)
    probe = first.statfs[str(hung_mount.mountpoint)]
    assert not probe.done and not probe.already_running
    for _ in range(5):
        again = look(cfg, runner).statfs[str(hung_mount.mountpoint)]
        assert again.already_running and not again.done
    assert stuck_probes(hung_mount.mountpoint) == 1
    assert runner.stuck() == 1
    hung_mount.release()
    wait_for(lambda: stuck_probes(hung_mount.mountpoint) == 0, what="the stuck child finishing")
    after = look(cfg, runner).statfs[str(hung_mount.mountpoint)]
    assert after.done and after.ok and runner.stuck() == 0


def test_daemon_keeps_repairing_rails_while_a_mount_hangs(
    hung_mount: HungMount, rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path,
) -> None:
    agent_config["lustre"] = [hung_mount.lustre_config("1s")]
    agent_config["lustre_interval"] = "0.3s"
    agent_config["resync_interval"] = "1h"
    runtime = Path(agent_config["runtime_dir"])
    hung_mount.hang()
    proc = rails_ns.start_daemon(write_config(tmp_path / "c.yaml", agent_config))

    def lustre() -> tuple[str, str]:
        data = read_status(runtime)
        if data is None:
            return ("", "")
        c = condition(data, "LustreReady")
        return c["status"], c["reason"]

    wait_for(lambda: lustre() == ("False", "MountHung"), timeout=20, what="MountHung")
    passes = read_status(runtime)["daemon"]["passes"]  # type: ignore[index]
    rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0")
    wait_for(lambda: rails_ns.addresses("r0") == ["10.10.0.5/24"], what="rail repaired")
    assert condition(read_status(runtime), "RoCENetworkReady")["status"] == "True"  # type: ignore[arg-type]
    time.sleep(2.0)  # several Lustre intervals: still one stuck probe, never a pile
    assert stuck_probes(hung_mount.mountpoint) == 1
    assert read_status(runtime)["daemon"]["passes"] > passes  # type: ignore[index]

    hung_mount.release()
    wait_for(lambda: lustre() == ("True", "MountsHealthy"), timeout=20, what="recovered")
    code, out = stop_daemon(proc)
    assert code == 0, out
