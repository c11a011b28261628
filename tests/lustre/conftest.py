from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hungmount import HERE, SOURCE, HungMount

from tests.kit.helpers import fuse_mount


@pytest.fixture
def hung_mount(tmp_path: Path) -> Iterator[HungMount]:
    """A real FUSE filesystem (mfusepy over libfuse3) whose statfs blocks on demand."""
    mnt = tmp_path / "scratch"
    mnt.mkdir()
    hold = tmp_path / "hold"
    with fuse_mount([sys.executable, str(HERE / "hungfs.py"), str(mnt), SOURCE, str(hold)],
                    mnt, tmp_path / "hungfs.log",
                    release=lambda: hold.unlink(missing_ok=True)) as proc:
        yield HungMount(mnt, hold, proc)  # released (every blocked statfs returns) at the end
