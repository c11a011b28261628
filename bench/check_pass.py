"""One full check pass with 8 rails (veth, real netlink) and a fixture GID table.

Prints p50/p99 of the pass (probe netlink + sysctls + GID table, then judge), in-process.
Goal: <= 50 ms. Usage: sudo .venv/bin/python bench/check_pass.py [--passes N] [--slots S]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import make_rails, reexec_in_netns, summary
from pyroute2 import IPRoute

from nodeagent.config import parse_config
from nodeagent.run.evaluate import Evaluator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--passes", type=int, default=300)
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--slots", type=int, default=255, help="GID slots per port (mlx5: 255)")
    args = ap.parse_args()
    reexec_in_netns()
    tmp = Path(tempfile.mkdtemp(prefix="nodeagent-bench-"))
    cfg = parse_config(make_rails(args.rails, tmp, args.slots))
    with IPRoute() as ipr:
        evaluator = Evaluator(cfg, ipr)
        evaluator.judge(evaluator.probe_and_repair(repair=True))  # bring the rails up first
        ms = []
        for _ in range(args.passes):
            t0 = time.perf_counter()
            evaluator.probe_and_repair()
            report = evaluator.judge()
            ms.append(1000 * (time.perf_counter() - t0))
        assert report.ok, report.as_dict()
    print(f"check pass: {args.rails} rails, {args.rails} RDMA devices x {args.slots} GID slots")
    print(summary("full pass (probe + judge)", ms))


if __name__ == "__main__":
    main()
