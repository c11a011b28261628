"""`nodeagent preflight` for a healthy gang of N pods (default 8), each a real process
started at once, as the init containers of an Indexed Job start: the wall time from their
start to the last one's exit (what the gang adds to pod start), and each one's own time.
The pods share this host's loopback (pod i serves its barrier card on 127.0.0.<i+1>); their
devices and the agent's status come from fixture trees (a character node with /dev/null's
numbers as uverbs0; FabricReady=True written by the agent's own writer, its lock held here
as the daemon holds it). The host has no RDMA device, so the rails carry no pinned GID and
the ring's RoCE probe is not part of this figure: the lab measures it between two kernels
(tests/lab/test_peers.py, test_4g).

Usage: .venv/bin/python bench/preflight.py [--pods 8] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import summary

from nodeagent.model.conditions import FABRIC_READY, Finding
from nodeagent.model.status import Report
from nodeagent.publish.status import DaemonLock, write_status
from tests.kit.helpers import free_port


def fixtures(root: Path) -> tuple[Path, Path, Path]:
    dev, sysfs, run = root / "dev", root / "sys", root / "run"
    (dev / "infiniband").mkdir(parents=True)
    os.mknod(dev / "infiniband" / "uverbs0", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (sysfs / "class" / "infiniband_verbs" / "uverbs0").mkdir(parents=True)
    (sysfs / "class" / "infiniband_verbs" / "uverbs0" / "ibdev").write_text("mlx5_0\n")
    # Its port as NCCL reads it (checks/nccl.py): ACTIVE, Ethernet, an IPv4 RoCE v2 GID.
    port = sysfs / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs" / "types").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("Ethernet\n")
    (port / "gids" / "0").write_text("0000:0000:0000:0000:0000:ffff:0a0a:0001\n")
    (port / "gid_attrs" / "types" / "0").write_text("RoCE v2\n")
    return dev, sysfs, run



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=8)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    dev, sysfs, run = fixtures(Path(tempfile.mkdtemp(prefix="nodeagent-bench-preflight-")))
    lock = DaemonLock(run)
    lock.acquire()
    report = Report("bench", [Finding(FABRIC_READY, "True", "AllConditionsPassed", "ok")])
    peers = ",".join(f"127.0.0.{i + 1}" for i in range(args.pods))
    gangs, each = [], []
    try:
        for _ in range(args.runs):
            write_status(run, report.as_dict(), {"state": "running", "resync_interval": 30})
            port = free_port()
            started = time.perf_counter()
            procs = [subprocess.Popen(
                [sys.executable, "-m", "nodeagent", "preflight", "--peers", peers,
                 "--index", str(i), "--gang-port", str(port), "--gang-bind", f"127.0.0.{i + 1}",
                 "--runtime-dir", str(run), "--dev", str(dev), "--sysfs", str(sysfs),
                 "--termination-log", "/nonexistent/termination-log"],
                stderr=subprocess.PIPE, text=True) for i in range(args.pods)]
            for proc in procs:
                _, err = proc.communicate(timeout=120)
                each.append((time.perf_counter() - started) * 1000)
                if proc.returncode != 0:
                    raise SystemExit(f"a preflight failed ({proc.returncode}): {err}")
            gangs.append((time.perf_counter() - started) * 1000)
    finally:
        lock.release()
    print(summary(f"gang of {args.pods}, to the last", gangs))
    print(summary("each pod, start to exit", each))


if __name__ == "__main__":
    main()
