"""The device-plugin check's costs, against the real parts the tests use.

  registry  image-platform lookups against Debian's docker-registry (TLS, token auth):
            cold (a new client each time: challenge, token, manifest, config) and warm
            (by digest, from the cache), p50/p99, with HTTP requests per lookup
  api       API requests the daemon's watching reader makes over N intervals, beside the
            one-shot reader's (3 GETs per read), on a real kube-apiserver

Usage: .venv/bin/python bench/deviceplugin.py registry|api [options]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, summary

sys.path.insert(0, str(ROOT / "tests" / "kube"))

from apiserver import ApiServer, add_identities, build_testenv
from kubernetes import client as k8s
from registry_env import start_registry

from nodeagent.config import DevicePlugin
from nodeagent.probes.kube import KubeReader, WatchingReader
from nodeagent.probes.registry import RegistryClient


def bench_registry(n: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="nodeagent-bench-registry-"))
    reg = start_registry(root)
    try:
        index = reg.push_index("rdma/dp", "multi", [("linux", "amd64", ""),
                                                    ("linux", "arm64", "v8")])
        single = reg.push_single("rdma/dp", "arm64", "linux", "arm64")
        creds = reg.docker_config(root / "docker.json")
        for label, image in (("index", f"{reg.host}/rdma/dp@{index}"),
                             ("single manifest", f"{reg.host}/rdma/dp@{single}")):
            cold, requests = [], 0
            for _ in range(n):
                client = RegistryClient(ca_bundle=reg.ca, docker_config=creds)
                t = time.perf_counter()
                assert client.image_platforms(image).error is None
                cold.append((time.perf_counter() - t) * 1000)
                requests += client.requests
            warm_client = RegistryClient(ca_bundle=reg.ca, docker_config=creds)
            warm_client.image_platforms(image)
            before = warm_client.requests
            warm = []
            for _ in range(n):
                t = time.perf_counter()
                warm_client.image_platforms(image)
                warm.append((time.perf_counter() - t) * 1000)
            print(summary(f"{label}: cold lookup", cold), f" {requests / n:.1f} requests each")
            print(summary(f"{label}: warm (digest)", warm),
                  f" {(warm_client.requests - before) / n:.1f} requests each")
    finally:
        reg.stop()


def bench_api(intervals: int, interval: float) -> None:
    server = ApiServer(Path(tempfile.mkdtemp(prefix="nodeagent-bench-dp-")) / "apiserver")
    server.workdir.mkdir()
    add_identities(server)
    server.start(build_testenv())
    server.apply_deploy()
    try:
        k8s.CoreV1Api(server.client("admin")).create_node(
            {"metadata": {"name": "node-a"}})  # type: ignore[arg-type]
        dp = DevicePlugin()
        once = KubeReader(server.client("agent-node-a"), "node-a")
        watching = WatchingReader(server.client("agent-node-a"), "node-a", dp, lambda: None)
        watching.device_plugin(dp)
        synced = watching.counters.requests
        for _ in range(intervals):
            once.device_plugin(dp)
            watching.device_plugin(dp)
            time.sleep(interval)
        watching.stop()
        print(f"one-shot reader: {once.counters.requests} requests over {intervals} reads "
              f"({once.counters.requests / intervals:.1f} per interval)")
        print(f"watching reader: {synced} requests to sync (3 lists + 3 watches), then "
              f"{watching.counters.requests - synced} over {intervals} intervals of "
              f"{interval:g} s (watches renew every 300 s)")
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["registry", "api"])
    p.add_argument("-n", type=int, default=200, help="lookups (registry)")
    p.add_argument("--intervals", type=int, default=60, help="intervals (api)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds (api)")
    args = p.parse_args()
    if args.what == "registry":
        bench_registry(args.n)
    else:
        bench_api(args.intervals, args.interval)


if __name__ == "__main__":
    main()
