"""tools/imagebuild.py's own parts: a layer's bytes depend on its files only, and a build
that cannot run says why in one line."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tools import imagebuild

ROOT = Path(__file__).resolve().parents[2]


def tree(root: Path, owner: int, mtime: int) -> Path:
    (root / "opt" / "b").mkdir(parents=True)
    (root / "opt" / "a.py").write_text("print('a')\n")
    (root / "opt" / "b" / "run").write_text("#!/bin/sh\n")
    (root / "opt" / "b" / "run").chmod(0o755)
    os.link(root / "opt" / "a.py", root / "opt" / "b" / "same.py")
    (root / "opt" / "link").symlink_to("a.py")
    for path in [root / "opt", *(root / "opt").rglob("*")]:
        os.lchown(path, owner, owner)
        os.utime(path, (mtime, mtime), follow_symlinks=False)
    return root


def test_a_layer_depends_on_its_files_only(tmp_path: Path) -> None:
    one = imagebuild.pack(tree(tmp_path / "one", 0, 1_000_000), 315532800)
    two = imagebuild.pack(tree(tmp_path / "two", 1234, 2_000_000), 315532800)
    assert one == two
    with tarfile.open(fileobj=io.BytesIO(one)) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["opt", "opt/a.py", "opt/b", "opt/b/run",
                                         "opt/b/same.py", "opt/link"]
    assert {(m.uid, m.gid, m.mtime) for m in members} == {(0, 0, 315532800)}
    kinds = {m.name: m for m in members}
    assert kinds["opt/b/run"].mode == 0o755
    assert kinds["opt/b/same.py"].islnk() and kinds["opt/b/same.py"].linkname == "opt/a.py"
    assert kinds["opt/link"].issym() and kinds["opt/link"].linkname == "a.py"
    assert imagebuild.pack(tmp_path / "one", 315532801) != one, "the epoch is an input"


def build_as_nobody(workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", "nobody", "--", str(ROOT / ".venv" / "bin" / "python"), "-m",
         "tools.imagebuild", "--cache", str(workdir / "cache"), "--out", str(workdir / "o")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(workdir)})


def test_a_build_that_cannot_run_says_why_in_one_line(tmp_path: Path) -> None:
    """As a user without root and nothing cached: first where it cannot write, then (given
    a directory of its own) that the Debian layer needs root. Nothing half-written."""
    res = build_as_nobody(tmp_path)  # pytest's directories are root's alone
    assert (res.returncode, res.stderr) == (
        1, f"tools/build-image: Permission denied: {tmp_path / 'cache'}\n")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        workdir.chmod(0o777)
        res = build_as_nobody(workdir)
        assert res.returncode == 1
        assert res.stderr == ("tools/build-image: building the Debian layer needs root "
                              "(mmdebstrap runs dpkg in a chroot)\n")
        assert not (workdir / "o").exists()
