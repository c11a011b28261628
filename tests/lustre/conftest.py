from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hungmount import HERE, SOURCE, HungMount, mounted


@pytest.fixture
def hung_mount(tmp_path: Path) -> Iterator[HungMount]:
    """A real FUSE filesystem (mfusepy over libfuse3) whose statfs blocks on demand."""
    if not Path("/dev/fuse").exists():
        raise RuntimeError("Lustre hang tests need /dev/fuse (a kernel with FUSE)")
    mnt = tmp_path / "scratch"
    mnt.mkdir()
    hold = tmp_path / "hold"
    log = open(tmp_path / "hungfs.log", "wb")  # noqa: SIM115 (the process owns it)
    proc = subprocess.Popen([sys.executable, str(HERE / "hungfs.py"), str(mnt), SOURCE,
                             str(hold)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while not mounted(mnt):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("hungfs did not mount: "
                               + (tmp_path / "hungfs.log").read_text()[-2000:])
        time.sleep(0.05)
    hm = HungMount(mnt, hold, proc)
    try:
        yield hm
    finally:
        hm.release()  # let every blocked statfs return, then unmount
        time.sleep(0.2)
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
