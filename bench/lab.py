"""The fabric lab's figures: image build (cold, or cached), boot to ssh, agent install, and
inside the guest the time from a rail address deletion to its restoration by the agent
(p50/p99; soft-RoCE guest under TCG here, so slower than a real host).

Usage: .venv/bin/python bench/lab.py [--count 100]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import ROOT

from tests.kit.helpers import wait_for
from tests.kit.labkit import addresses, start_agent
from tests.kit.vm import boot, build_image, wheelhouse


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=100)
    args = p.parse_args()
    t = time.perf_counter()
    image = build_image()
    print(f"image: {time.perf_counter() - t:.1f} s ({image.dir.name})")
    t = time.perf_counter()
    vm = boot(image, Path(tempfile.mkdtemp(prefix="nodeagent-bench-lab-")))
    print(f"boot to ssh ({vm.accel}): {time.perf_counter() - t:.1f} s")
    try:
        t = time.perf_counter()
        vm.put(wheelhouse(vm.workdir / "wheels"), "/root/wheels")
        vm.put(ROOT / "tests" / "lab" / "guest", "/root/guest")
        vm.put(ROOT / "units" / "nodeagent.service", "/etc/systemd/system/nodeagent.service")
        vm.ssh("python3 -m venv --system-site-packages --without-pip /opt/nodeagent/venv && "
               "/opt/nodeagent/venv/bin/python -m pip install -q --no-compile --no-index "
               "--find-links /root/wheels nodeagent && systemctl daemon-reload", timeout=900)
        vm.ssh("rdma link add rxe0 type rxe netdev ens4 && rdma link add rxe1 type rxe "
               "netdev ens5")
        print(f"agent install: {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        # Deleting the same address 100 times is what the repair guard exists to stop
        # (ManagedElsewhere): lift it for the measurement, as bench/repair_latency.py does.
        start_agent(vm, repair_guard={"max_repairs": 100_000})
        print(f"systemctl start (READY after the first pass): {time.perf_counter() - t:.1f} s")
        wait_for(lambda: addresses(vm, "ens4") == ["10.10.0.5/24"], 10, "the rail")
        print(vm.ssh(f"/opt/nodeagent/venv/bin/python /root/guest/repair_latency.py ens4 "
                     f"10.10.0.5 24 {args.count}", timeout=1800).stdout.strip())
    finally:
        vm.kill()


if __name__ == "__main__":
    main()
