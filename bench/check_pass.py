"""Full passes with 8 rails (veth, real netlink) and a fixture GID table, in-process.

Prints p50/p99 of two kinds of full pass, both through the one pass function:
  full pass       netlink (one dump per object kind) + sysctls + counters, then judge: what
                  a pass costs while nothing says the GID table changed (goal: <= 15 ms p99)
  full pass, GID  the same with the whole GID table re-read (first pass, resync, overflow)
Usage: sudo .venv/bin/python bench/check_pass.py [--passes N] [--slots S]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

from common import make_rails, reexec_in_netns, summary
from pyroute2 import IPRoute

from nodeagent.config import parse_config
from nodeagent.run.evaluate import Evaluator, fabric_pass


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
        fabric_pass(evaluator, repair=True)  # bring the rails up first
        gc.collect()
        gc.freeze()  # as the daemon does after its first pass
        kinds: dict[str, list[float]] = {"full pass": [], "full pass, GID table read": []}
        for i in range(2 * args.passes):
            kind = list(kinds)[i % 2]
            if i % 2:
                evaluator.mark_gid_stale(everywhere=True)
            t0 = time.perf_counter()
            report, _ = fabric_pass(evaluator, repair=False)
            kinds[kind].append(1000 * (time.perf_counter() - t0))
            assert report.ok, report.as_dict()
    print(f"check pass: {args.rails} rails, {args.rails} RDMA devices x {args.slots} GID slots")
    for kind, ms in kinds.items():
        print(summary(kind, ms))


if __name__ == "__main__":
    main()
