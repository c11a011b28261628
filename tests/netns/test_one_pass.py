"""`check`, `apply` and the daemon run one pass function: given the same drift they must
repair the same things, in the same order, and reach the same verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.kit.helpers import Netns, new_netns, read_status, stop_daemon, wait_for, write_config


def verdict(data: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(c["type"], c["status"], c["reason"], c["message"]) for c in data["conditions"]]


def repaired_lines(log_text: str) -> list[str]:
    return [line.split(": repaired ", 1)[1] for line in log_text.splitlines()
            if ": repaired " in line]


def test_apply_and_the_daemon_repair_and_judge_alike(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    twin = new_netns()  # the same fresh rails: nothing configured on either
    try:
        twin.veth("r0", "p0")
        twin.veth("r1", "p1")
        cfg_apply = write_config(tmp_path / "apply.yaml", agent_config)
        res = rails_ns.nodeagent("apply", "--config", str(cfg_apply), "--json")
        applied = json.loads(res.stdout)
        assert res.returncode == 0 and len(applied["actions"]) == 19, res.stdout
        checked = json.loads(rails_ns.nodeagent("check", "--config", str(cfg_apply),
                                                "--json").stdout)

        daemon_cfg = {**agent_config, "state_dir": str(tmp_path / "state-run"),
                      "runtime_dir": str(tmp_path / "run-run")}
        proc = twin.start_daemon(write_config(tmp_path / "run.yaml", daemon_cfg))
        status = wait_for(lambda: (s := read_status(tmp_path / "run-run")) and s["ok"] and s,
                          what="the daemon's pass to make the fabric ready")
        code, log_text = stop_daemon(proc)
        assert code == 0, log_text
        # The same repairs in the same order (the daemon logs each one as it runs) ...
        assert repaired_lines(log_text) == applied["actions"]
        # ... and word for word the verdict of apply's pass (the one that learned the pins)
        # or, if the daemon has run a pass since, of check's.
        assert verdict(status) in (verdict(applied), verdict(checked))
        assert verdict(applied) != verdict(checked)  # the two differ only by "learned pin"
        assert (json.loads((tmp_path / "state-run" / "pins.json").read_text())
                == json.loads((Path(agent_config["state_dir"]) / "pins.json").read_text()))
    finally:
        twin.delete()
