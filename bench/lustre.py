"""Lustre checks on real FUSE mounts (tests/lustre/hungfs.py) standing in for Lustre.

  1. one look at 4 healthy mounts (mountinfo, health, 4 statfs children in parallel):
     p50/p99
  2. the agent's pass time (2 veth rails, probe + judge) while the Lustre monitor thread
     runs, with all mounts healthy and then with one hung: p50/p99 of each

Usage: sudo .venv/bin/python bench/lustre.py [--looks 100] [--passes 300]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, make_rails, reexec_in_netns, summary
from pyroute2 import IPRoute

from nodeagent.config import parse_config
from nodeagent.io.commands import BoundedRunner
from nodeagent.run.evaluate import Evaluator, fabric_pass
from nodeagent.run.lustre import LustreMonitor, look

SOURCE = "10.0.0.1@o2ib:/scratch"


def mount(tmp: Path, i: int) -> tuple[Path, Path, subprocess.Popen[bytes]]:
    mnt, hold = tmp / f"mnt{i}", tmp / f"hold{i}"
    mnt.mkdir()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/lustre/hungfs.py"), str(mnt),
                             SOURCE, str(hold)], stderr=subprocess.DEVNULL)
    while str(mnt) not in Path("/proc/self/mountinfo").read_text():
        time.sleep(0.05)
    return mnt, hold, proc


def passes(evaluator: Evaluator, n: int) -> list[float]:
    ms = []
    for _ in range(n):
        t0 = time.perf_counter()
        fabric_pass(evaluator, repair=True)
        ms.append(1000 * (time.perf_counter() - t0))
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--looks", type=int, default=100)
    ap.add_argument("--passes", type=int, default=300)
    args = ap.parse_args()
    reexec_in_netns()
    tmp = Path(tempfile.mkdtemp(prefix="nodeagent-bench-lustre-"))
    mounts = [mount(tmp, i) for i in range(4)]
    try:
        lustre = [{"mountpoint": str(m), "source": SOURCE, "fstype": "fuse.hungfs",
                   "timeout": "1s"} for m, _, _ in mounts]
        data = make_rails(2, tmp)
        cfg = parse_config({**data, "lustre": lustre, "lustre_interval": "0.5s"})
        runner = BoundedRunner()
        ms = []
        for _ in range(args.looks):
            t0 = time.perf_counter()
            obs = look(cfg, runner)
            ms.append(1000 * (time.perf_counter() - t0))
        assert all(p.ok for p in obs.statfs.values())
        print(summary("look at 4 healthy mounts", ms))

        with IPRoute() as ipr:
            evaluator = Evaluator(cfg, ipr)
            monitor = LustreMonitor(
                cfg, lambda seen: setattr(evaluator.store, "lustre", seen.observation))
            monitor.start()
            time.sleep(1.0)
            healthy = passes(evaluator, args.passes)
            mounts[0][1].touch()  # mount 0 hangs from now on
            time.sleep(1.5)
            hung = passes(evaluator, args.passes)
            reason = next(f.reason for f in evaluator.judge().findings if f.type == "LustreReady")
            monitor.stop()
        print(summary("agent pass, mounts healthy", healthy))
        print(summary(f"agent pass, 1 hung ({reason})", hung))
    finally:
        for mnt, hold, proc in mounts:
            hold.unlink(missing_ok=True)
            time.sleep(0.1)
            subprocess.run(["umount", "-l", str(mnt)], check=False)
            proc.terminate()


if __name__ == "__main__":
    main()
