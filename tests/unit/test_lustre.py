"""Lustre parsers and LustreReady reasons on fixture trees and recorded `lfs` output."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from nodeagent.checks.lustre import lustre_finding
from nodeagent.config import parse_config
from nodeagent.probes.lustre import (
    BoundedRunner,
    Health,
    parse_health,
    parse_lfs_check,
    parse_mountinfo,
    read_health,
)
from nodeagent.run.lustre import look, look_and_repair

SRC = "10.0.0.1@o2ib:10.0.0.2@o2ib:/scratch"
LUSTRE_LINE = ("98 29 0:52 / /lustre/scratch rw,relatime shared:50 - lustre "
               f"{SRC} rw,flock,lazystatfs,encrypt")
LFS_OK = """scratch-MDT0000-mdc-ffff8881083c6000: active.
scratch-OST0000-osc-ffff8881083c6000: active.
scratch-OST0001-osc-ffff8881083c6000: active.
"""
LFS_DOWN = """scratch-MDT0000-mdc-ffff8881083c6000: active.
scratch-OST0000-osc-ffff8881083c6000: check error: Resource temporarily unavailable
scratch-OST0001-osc-ffff8881083c6000: check error: Cannot send after transport endpoint shutdown
other-OST0000-osc-ffff8881083c6000: check error: Input/output error
"""


def tree(tmp: Path, mountinfo: str, health: str | None = "healthy\n",
         where: str = "sys") -> tuple[Path, Path]:
    proc, sysfs = tmp / "proc", tmp / "sys"
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    if health is not None:
        base = (sysfs if where == "sys" else proc) / "fs" / "lustre"
        base.mkdir(parents=True, exist_ok=True)
        (base / "health_check").write_text(health)
    return proc, sysfs


def fake_lfs(tmp: Path, output: str, exit_code: int = 0, sleep: float = 0) -> Path:
    """A recorded `lfs check servers` reply, played by a real executable."""
    (tmp / "lfs.out").write_text(output)
    script = tmp / "lfs"
    script.write_text(f"#!/bin/sh\nsleep {sleep}\ncat {tmp / 'lfs.out'}\nexit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def finding(tmp: Path, mountinfo: str, mount: dict[str, Any] | None = None,
            health: str | None = "healthy\n", lfs: Path | None = None,
            where: str = "sys") -> tuple[str, str, str]:
    proc, sysfs = tree(tmp, mountinfo, health, where)
    cfg = parse_config({
        "paths": {"sysfs": str(sysfs), "procfs": str(proc), "lfs": str(lfs or tmp / "no-lfs")},
        "lustre": [mount or {"mountpoint": "/lustre/scratch", "source": SRC,
                             "options": ["flock"]}],
    })
    obs = look(cfg, BoundedRunner())
    f = lustre_finding(cfg, obs)
    return f.status, f.reason, f.message


def test_mountinfo_parsing_with_escapes_and_garbage() -> None:
    text = "\n".join([
        LUSTRE_LINE,
        r"99 29 0:53 / /lustre/with\040space rw - lustre 10.0.0.1@o2ib:/proj rw,flock",
        "garbage line without separator",
        "100 29 0:54 / /truncated rw -",
        "",
    ])
    entries, errors = parse_mountinfo(text)
    assert [(e.mountpoint, e.fstype, e.source) for e in entries] == [
        ("/lustre/scratch", "lustre", SRC),
        ("/lustre/with space", "lustre", "10.0.0.1@o2ib:/proj"),
    ]
    assert "flock" in entries[0].options and "relatime" in entries[0].options
    assert errors == ["mountinfo line 3: unparsable 'garbage line without separator'",
                      "mountinfo line 4: unparsable '100 29 0:54 / /truncated rw -'"]


def test_health_check_parsing() -> None:
    assert parse_health("healthy\n") == Health("healthy")
    unhealthy = parse_health("NOT HEALTHY\ndevice scratch-OST0001-osc reported unhealthy\n")
    assert unhealthy == Health("unhealthy", "device scratch-OST0001-osc reported unhealthy")
    assert parse_health("LBUG\n").state == "lbug"
    assert parse_health("").state == "unreadable"
    assert parse_health("\x00\xffjunk").state == "unreadable"
    assert parse_health("heal").state == "unreadable"  # truncated


def test_health_check_older_procfs_layout() -> None:
    # Older clients' procfs (obd_proc_health_seq_show): a line per sick device, then the
    # verdict. Read as unhealthy with the devices named, not as unreadable.
    text = ("device scratch-OST0001-osc-ffff8f reported unhealthy\n"
            "device scratch-MDT0000-mdc-ffff8f reported unhealthy\n"
            "NOT HEALTHY\n")
    assert parse_health(text) == Health(
        "unhealthy", "device scratch-OST0001-osc-ffff8f reported unhealthy; "
        "device scratch-MDT0000-mdc-ffff8f reported unhealthy")
    assert parse_health("NOT HEALTHY\n") == Health("unhealthy", "NOT HEALTHY")
    assert parse_health("healthy\nhealthy\n").state == "unreadable"


def test_health_check_from_procfs_when_sysfs_lacks_it(tmp_path: Path) -> None:
    proc, sysfs = tree(tmp_path, LUSTRE_LINE, "NOT HEALTHY\n", where="proc")
    assert read_health(sysfs, proc).state == "unhealthy"
    assert read_health(tmp_path / "x", tmp_path / "y").state == "absent"


def test_lfs_output_parsing() -> None:
    targets = parse_lfs_check(LFS_DOWN + "garbage\n: no name\n")
    assert targets["scratch-MDT0000-mdc-ffff8881083c6000"] == "active"
    assert targets["scratch-OST0000-osc-ffff8881083c6000"].startswith("check error")
    assert len(targets) == 4


def test_reasons(tmp_path: Path) -> None:
    def case(name: str, **kw: Any) -> tuple[str, str, str]:
        d = tmp_path / name
        d.mkdir()
        return finding(d, **kw)

    # The probe of a fixture mountpoint fails (nothing is mounted at /lustre here), so
    # judge these on mountinfo with a mountpoint that exists and answers: this test's own
    # directory (not /: the root filesystem is refused as a Lustre mountpoint).
    here = str(tmp_path)
    root_line = LUSTRE_LINE.replace("/lustre/scratch", here)
    root = {"mountpoint": here, "source": SRC, "options": ["flock"]}
    assert case("ok", mountinfo=root_line, mount=root)[:2] == ("True", "MountsHealthy")
    assert case("absent", mountinfo="")[:2] == ("False", "NotMounted")
    assert case("type", mountinfo=root_line.replace(" lustre ", " nfs4 "), mount=root)[:2] == (
        "False", "WrongType")
    status, reason, message = case("source", mountinfo=root_line.replace(SRC, "10.9.9.9@tcp:/x"),
                                   mount=root)
    assert (status, reason) == ("False", "WrongSource")
    assert message == f"{here}: source 10.9.9.9@tcp:/x, want {SRC}"
    assert case("option", mountinfo=root_line.replace(",flock", ""), mount=root)[:2] == (
        "False", "MissingOption")
    assert case("unhealthy", mountinfo=root_line, mount=root,
                health="NOT HEALTHY\ndevice scratch-OST0001 reported unhealthy\n")[:2] == (
        "False", "LustreUnhealthy")
    assert case("lbug", mountinfo=root_line, mount=root, health="LBUG\n")[1] == "LustreUnhealthy"
    assert case("garbage", mountinfo=root_line, mount=root, health="\x00\x01")[:2] == (
        "Unknown", "HealthUnreadable")
    d = tmp_path / "lfs-down"
    d.mkdir()
    status, reason, message = finding(d, root_line, root, lfs=fake_lfs(d, LFS_DOWN, 1))
    assert (status, reason) == ("False", "TargetUnreachable")
    assert message == (f"{here}: unreachable targets scratch-OST0000-osc-ffff8881083c6000, "
                       "scratch-OST0001-osc-ffff8881083c6000")
    d = tmp_path / "lfs-ok"
    d.mkdir()
    assert finding(d, root_line, root, lfs=fake_lfs(d, LFS_OK))[:2] == ("True", "MountsHealthy")
    d = tmp_path / "lfs-hangs"
    d.mkdir()
    hung = {**root, "timeout": "0.3s"}
    assert finding(d, root_line, hung, lfs=fake_lfs(d, LFS_OK, sleep=5))[:2] == (
        "Unknown", "TargetCheckFailed")


def test_remount_runs_only_when_configured_and_needed(tmp_path: Path) -> None:
    proc, sysfs = tree(tmp_path, "")
    marker = tmp_path / "remounted"
    base = {"paths": {"sysfs": str(sysfs), "procfs": str(proc), "lfs": "no-such-lfs"}}
    mount = {"mountpoint": "/lustre/scratch", "source": SRC}
    cfg = parse_config({**base, "lustre": [mount]})
    _, done, errors = look_and_repair(cfg, BoundedRunner(), repair=True)
    assert done == [] and errors == [] and not marker.exists()  # off by default

    cmd = ["sh", "-c", f"touch {marker}"]
    cfg = parse_config({**base, "lustre": [{**mount, "remount_command": cmd}]})
    _, done, errors = look_and_repair(cfg, BoundedRunner(), repair=False)
    assert done == [] and not marker.exists()  # check never repairs
    _, done, errors = look_and_repair(cfg, BoundedRunner(), repair=True)
    assert marker.exists() and errors == []
    assert done == [f"/lustre/scratch: remount (NotMounted): sh -c touch {marker}"]

    failing = parse_config({**base, "lustre": [{**mount, "remount_command": ["false"]}]})
    _, done, errors = look_and_repair(failing, BoundedRunner(), repair=True)
    assert done == [] and errors == ["/lustre/scratch: remount (NotMounted): false: failed: "]


def test_not_yet_checked_and_not_configured() -> None:
    assert lustre_finding(parse_config({}), None).reason == "NotConfigured"
    cfg = parse_config({"lustre": [{"mountpoint": "/l", "source": SRC}]})
    assert lustre_finding(cfg, None).status == "Unknown"


def test_config_rejects_relative_mountpoints_and_duplicates() -> None:
    import pytest

    from nodeagent.config import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_config({"lustre": [{"mountpoint": "lustre", "source": SRC},
                                 {"mountpoint": "/l", "source": SRC},
                                 {"mountpoint": "/l/", "source": SRC}]})
    # Field and cross-field problems in one run: an operator fixes both at once.
    assert info.value.problems == ["lustre[0].mountpoint: 'lustre' is not an absolute path",
                                   "lustre[2].mountpoint: '/l' duplicates lustre[1].mountpoint"]
    with pytest.raises(ConfigError) as info:
        parse_config({"lustre": [{"mountpoint": "/l", "source": SRC},
                                 {"mountpoint": "/l/", "source": SRC}]})
    assert info.value.problems == ["lustre[1].mountpoint: '/l' duplicates lustre[0].mountpoint"]
