"""`nodeagent status`: a missing, corrupt, stale or orphaned status file is said plainly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from nodeagent.fsutil import write_json_atomic
from nodeagent.publish.status import read_status, write_status


def status_cli(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"node_name: n1\nruntime_dir: {tmp_path / 'run'}\nresync_interval: 10s\n")
    return subprocess.run([sys.executable, "-m", "nodeagent", "status", "--config", str(cfg),
                           *extra], capture_output=True, text=True)


REPORT = {"node": "n1", "ok": True, "actions": [], "conditions": [
    {"type": "FabricReady", "status": "True", "reason": "AllConditionsPassed", "message": ""}]}


def test_no_status_file(tmp_path: Path) -> None:
    res = status_cli(tmp_path)
    assert res.returncode == 1
    want = f"no status file at {tmp_path}/run/status.json: the daemon has not run"
    assert res.stdout.strip() == want
    res = status_cli(tmp_path, "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["daemon"]["running"] is False


def test_fresh_status_of_a_live_daemon(tmp_path: Path) -> None:
    write_status(tmp_path / "run", REPORT, {"state": "running", "passes": 3})  # our pid: alive
    res = status_cli(tmp_path, "--json")
    assert res.returncode == 0, res.stdout
    data = json.loads(res.stdout)
    assert data["daemon"]["running"] is True and data["daemon"]["stale"] is False
    assert data["daemon"]["pid"] == os.getpid()


def test_stale_status_means_not_ok(tmp_path: Path) -> None:
    write_status(tmp_path / "run", REPORT, {"state": "running"})
    path = tmp_path / "run" / "status.json"
    data = json.loads(path.read_text())
    data["daemon"]["updated_at"] = time.time() - 300  # stale after 2 x 10 s + 10 s
    path.write_text(json.dumps(data))
    res = status_cli(tmp_path)
    assert res.returncode == 1
    assert res.stdout.splitlines()[-1].startswith("status is stale: last pass 300s ago")


def test_dead_daemon(tmp_path: Path) -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    write_status(tmp_path / "run", REPORT, {"state": "running"})
    path = tmp_path / "run" / "status.json"
    data = json.loads(path.read_text())
    data["daemon"]["pid"] = child.pid  # reaped: no such process
    path.write_text(json.dumps(data))
    view = read_status(tmp_path / "run", stale_after=30)
    assert view.running is False
    res = status_cli(tmp_path)
    assert res.returncode == 1
    assert res.stdout.splitlines()[-1] == (
        f"daemon is not running (pid {child.pid} is gone); last status is 0s old")


def test_corrupt_status_file(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "status.json").write_text('{"node": "n1", "ok": tr')
    res = status_cli(tmp_path)
    assert res.returncode == 1
    assert res.stderr.startswith(f"cannot read status file {tmp_path}/run/status.json: ")


def test_atomic_write_leaves_no_temporary_files(tmp_path: Path) -> None:
    for i in range(5):
        write_json_atomic(tmp_path / "x.json", {"i": i})
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
    assert json.loads((tmp_path / "x.json").read_text()) == {"i": 4}
