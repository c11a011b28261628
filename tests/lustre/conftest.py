from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SOURCE = "10.0.0.1@o2ib:/scratch"


@dataclass
class HungMount:
    mountpoint: Path
    hold: Path
    proc: subprocess.Popen[bytes]

    def hang(self) -> None:
        self.hold.touch()

    def release(self) -> None:
        self.hold.unlink(missing_ok=True)

    def lustre_config(self, timeout: str = "1s") -> dict[str, object]:
        return {"mountpoint": str(self.mountpoint), "source": SOURCE, "fstype": "fuse.hungfs",
                "timeout": timeout}


def mounted(mountpoint: Path) -> bool:
    return any(line.split()[4] == str(mountpoint)
               for line in Path("/proc/self/mountinfo").read_text().splitlines())


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


def stuck_probes(mountpoint: Path) -> int:
    """statfs children of the agent still waiting on this mountpoint."""
    count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0] == b"stat" and str(mountpoint).encode() in argv:
            count += 1
    return count
