"""Shared by the benchmarks: run inside a fresh namespace, percentiles, a rails config."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.kit.helpers import Netns, make_gid_tree, roce_entries

ROOT = Path(__file__).resolve().parent.parent


INSIDE = "NODEAGENT_BENCH_INSIDE"


def reexec_in_netns() -> None:
    """Run this script again inside a throwaway network namespace, then delete it."""
    if os.environ.get(INSIDE):
        return
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root (it creates a network namespace)")
    ns = f"nodeagent-bench-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        env = {**os.environ, INSIDE: ns}
        code = subprocess.run(["ip", "netns", "exec", ns, sys.executable, *sys.argv],
                              env=env).returncode
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    raise SystemExit(code)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def make_rails(n: int, tmp: Path, slots: int = 255) -> dict[str, Any]:
    """n veth rails with carrier and a matching mlx5-like GID table of `slots` per port."""
    ip("link", "set", "lo", "up")
    rails = []
    for i in range(n):
        ip("link", "add", "name", f"r{i}", "type", "veth", "peer", "name", f"p{i}")
        ip("link", "set", f"p{i}", "up")
        net = f"10.{100 + i // 250}.{i % 250}"  # a /24 each, for up to 37,000 rails
        addr = f"{net}.5"
        make_gid_tree(tmp / "sys", f"mlx5_{i}", roce_entries(f"r{i}", addr), slots=slots)
        rails.append({"name": f"rail{i}", "interface": f"r{i}", "address": f"{addr}/24",
                      "mtu": 4200, "table": 1000 + i, "rule_priority": 1000 + i,
                      "gateway": f"{net}.1"})
    return {
        "node_name": "bench",
        "paths": {"sysfs": str(tmp / "sys")},
        "state_dir": str(tmp / "state"),
        "runtime_dir": str(tmp / "run"),
        "rails": rails,
    }


def netns_rails(ns: Netns, sysfs: Path, n: int = 2) -> list[dict[str, Any]]:
    """n veth rails in a test namespace with matching GID fixture trees under `sysfs`:
    the rails section of a config (for the benches that run the daemon in a namespace)."""
    rails = []
    for i in range(n):
        ns.veth(f"r{i}", f"p{i}")
        make_gid_tree(sysfs, f"mlx5_{i}", roce_entries(f"r{i}", f"10.1{i}.0.5"))
        rails.append({"name": f"rail{i}", "interface": f"r{i}", "address": f"10.1{i}.0.5/24"})
    return rails


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(name: str, ms: list[float]) -> str:
    return (f"{name:<28} n={len(ms):<4} p50={pct(ms, 50):7.2f} ms  p99={pct(ms, 99):7.2f} ms  "
            f"max={max(ms):7.2f} ms  mean={statistics.fmean(ms):7.2f} ms")
