"""`nodeagent status`: a missing, corrupt, stale or orphaned status file is said plainly."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.io.files import write_json_atomic
from nodeagent.publish.status import (
    AlreadyRunning,
    DaemonLock,
    daemon_holding,
    read_status,
    write_status,
)


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
    write_status(tmp_path / "run", REPORT, {"state": "running", "passes": 3})
    # A live pid is not enough: only the holder of the daemon lock is the daemon.
    res = status_cli(tmp_path, "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["daemon"]["running"] is False
    lock = DaemonLock(tmp_path / "run")
    lock.acquire()  # as `nodeagent run` does
    try:
        res = status_cli(tmp_path, "--json")
    finally:
        lock.release()
    assert res.returncode == 0, res.stdout
    data = json.loads(res.stdout)
    assert data["daemon"]["running"] is True and data["daemon"]["stale"] is False
    assert data["daemon"]["pid"] == os.getpid()


def test_a_second_lock_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = DaemonLock(tmp_path)
    first.acquire()
    try:
        with pytest.raises(AlreadyRunning) as info:
            DaemonLock(tmp_path).acquire()
        assert info.value.pid == os.getpid()
        assert str(info.value) == (f"another nodeagent daemon (pid {os.getpid()}) holds "
                                   f"{tmp_path}/daemon.lock")
    finally:
        first.release()
    DaemonLock(tmp_path).acquire()  # free once released (or once its holder dies)


def test_a_deleted_lock_file_admits_no_second_daemon_even_before_a_pass(
        tmp_path: Path) -> None:
    """Before, the window between the deletion and the holder's next pass let a second
    daemon lock a new file and run beside the first. The runtime dir's name (an abstract
    socket: no file to delete) refuses it, and names the holder."""
    first = DaemonLock(tmp_path)
    first.acquire()
    try:
        (tmp_path / "daemon.lock").unlink()
        with pytest.raises(AlreadyRunning) as info:
            DaemonLock(tmp_path).acquire()
        assert info.value.pid == os.getpid()
        assert daemon_holding(tmp_path) == os.getpid()  # `status` still finds it
        assert not (tmp_path / "daemon.lock").exists()  # the refused one made nothing
    finally:
        first.release()
    assert daemon_holding(tmp_path) is None
    DaemonLock(tmp_path).acquire()


def test_stale_status_means_not_ok(tmp_path: Path) -> None:
    write_status(tmp_path / "run", REPORT, {"state": "running"})
    lock = DaemonLock(tmp_path / "run")
    lock.acquire()  # a daemon holds it, but its last pass is old
    path = tmp_path / "run" / "status.json"
    data = json.loads(path.read_text())
    data["daemon"]["updated_at"] = time.time() - 300  # stale after 2 x 10 s + 10 s
    path.write_text(json.dumps(data))
    res = status_cli(tmp_path)
    lock.release()
    assert res.returncode == 1
    # 300 s, plus however long the CLI took to start on a busy host
    last = res.stdout.splitlines()[-1]
    age = re.match(r"status is stale: last pass (\d+)s ago", last)
    assert age and 300 <= int(age.group(1)) < 360, last


def test_dead_daemon(tmp_path: Path) -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    write_status(tmp_path / "run", REPORT, {"state": "running"})
    path = tmp_path / "run" / "status.json"
    data = json.loads(path.read_text())
    data["daemon"]["pid"] = child.pid  # reaped: no such process
    path.write_text(json.dumps(data))
    view = read_status(tmp_path / "run", stale_seconds=30)
    assert view.running is False
    res = status_cli(tmp_path)
    assert res.returncode == 1
    last = res.stdout.splitlines()[-1]  # 0 s old, or 1 when the CLI started slowly
    assert re.fullmatch(rf"daemon is not running \(pid {child.pid} is gone\); "
                        r"last status is [0-9]s old", last), last


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


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
    | st.text(max_size=20) | st.just("\x1b[31mred\x1b[0m"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=15)
_condition = st.fixed_dictionaries(
    {"type": st.text(max_size=10), "status": st.sampled_from(["True", "False", "\x1b]0;x\x07"]),
     "reason": st.text(max_size=10), "message": st.text(max_size=30)},
    optional={"problems": st.lists(st.text(max_size=10), max_size=3) | _json})
_status = st.fixed_dictionaries({}, optional={
    "node": st.text(max_size=10) | _json, "ok": st.booleans() | _json,
    "conditions": st.lists(_condition | _json, max_size=3) | _json,
    "actions": st.lists(st.text(max_size=10), max_size=2) | _json,
    "errors": st.lists(st.text(max_size=10), max_size=2) | _json,
    "daemon": st.fixed_dictionaries({}, optional={
        "pid": st.integers(-5, 2**80) | _json,
        "updated_at": st.floats() | st.integers(-(2**70), 2**70) | _json}) | _json})


@given(_status | _json)
def test_generated_status_files_never_crash_status(tmp_path_factory: Any, doc: Any) -> None:
    from nodeagent.cli.main import main

    tmp = tmp_path_factory.mktemp("st")
    (tmp / "run").mkdir()
    (tmp / "run" / "status.json").write_text(json.dumps(doc))
    cfg = tmp / "c.yaml"
    cfg.write_text(f"runtime_dir: {tmp / 'run'}\n")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["status", "--config", str(cfg)])
    assert code in (0, 1), code
    assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue()
    assert len(err.getvalue().splitlines()) <= 1


def test_a_forged_status_file_cannot_flood_the_terminal(tmp_path: Path) -> None:
    """A status file is the daemon's, but a reader must survive one forged to be huge: each
    condition lists its problems one per line, at most MAX_LISTED of them, each cut to
    MAX_FIELD characters; a message that once would have been split on '; ' is one line."""
    from nodeagent.cli.main import MAX_FIELD, MAX_LISTED, main

    # Within the status file's 8 MiB cap: ~2 MB of "a; " (the forgery that once ran past
    # 20 s, split into 600,000 lines) and 100,000 listed problems.
    huge = {"node": "n" * 100_000, "ok": False, "actions": ["a"] * 50_000,
            "errors": ["e"] * 50_000, "daemon": {"pid": 1, "updated_at": time.time()},
            "conditions": [
                {"type": "RoCEGIDStable", "status": "False", "reason": "GIDIndexShifted",
                 "message": "x", "problems": ["p" * 5000] * 100 + ["p"] * 100_000},
                {"type": "LustreReady", "status": "False", "reason": "MountMissing",
                 "message": "a; " * 600_000}]}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "status.json").write_text(json.dumps(huge))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"runtime_dir: {tmp_path / 'run'}\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["status", "--config", str(cfg)]) == 1
    lines = out.getvalue().splitlines()
    listed = [ln for ln in lines if ln.startswith("      p")]
    assert len(listed) == MAX_LISTED
    assert all(len(ln) <= MAX_FIELD + 10 for ln in listed)
    assert f"... and {100_100 - MAX_LISTED} more (--json has them all)" in out.getvalue()
    # A message with no list is printed as the one problem it is, cut to MAX_FIELD.
    assert sum("a; a; " in ln for ln in lines) == 1
    assert len(lines) < 3 * MAX_LISTED + 10 and len(out.getvalue()) < 4 * MAX_LISTED * MAX_FIELD


def test_the_status_document_is_parsed_once_into_types_whatever_the_file_holds() -> None:
    """The one reader `status`, `check` and preflight share: a field of the wrong type reads
    as absent, never as a value of another type (a port "5", a pid true); lists are capped;
    a condition without a problem list shows its message as its one problem."""
    from nodeagent.publish.status import MAX_LINES, RailLine, StatusDocument

    rails: list[Any] = [{"name": "rail0", "rdma_port": "5", "gid_index_pinned": True,
                         "address": 7, "nccl_default_gid_index": 3}, "junk", None]
    rails += [{"name": f"r{i}"} for i in range(100)]
    doc = StatusDocument.parse({
        **REPORT, "rails": rails, "lustre": [{"mountpoint": "/lustre"}, {"mountpoint": 1}, 2],
        "errors": ["e"] * 1000,
        "conditions": [{**REPORT["conditions"][0], "message": "m", "problems": ["a", "b"]},
                       {"type": "LustreReady", "status": "False", "reason": "r",
                        "message": "only this"}],
        "daemon": {"pid": True, "updated_at": 5, "resync_interval": 1e300}})
    assert doc.rails[0] == RailLine("rail0", nccl_default_gid_index=3)
    assert len(doc.rails) == MAX_LINES - 2 and len(doc.errors) == MAX_LINES
    assert doc.lustre == ("/lustre",) and doc.pid is None and doc.updated_at == 5.0
    fabric, lustre = doc.condition("FabricReady"), doc.condition("LustreReady")
    assert fabric is not None and fabric.problems == ("a", "b")
    assert lustre is not None and lustre.problems == ("only this",)
    with pytest.raises(ValueError, match="'daemon' is not a dict"):
        StatusDocument.parse(REPORT)  # a file the daemon wrote has its daemon section
    assert StatusDocument.parse(REPORT, written=False).node == "n1"  # `check`'s report
