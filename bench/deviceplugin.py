"""The device-plugin check's costs, against the real parts the tests use.

  registry  image-platform lookups against Debian's docker-registry (TLS, token auth):
            cold (a new client each time: challenge, token, manifest, config) and warm
            (by digest, from the cache), p50/p99, with HTTP requests per lookup
  api       API requests the daemon's watching reader makes over N intervals, beside the
            one-shot reader's (3 GETs per read), on a real kube-apiserver
  check     a full device-plugin check (Kubernetes objects, image platform from the
            registry, the finding) on the real apiserver and registry: cold digest cache
            (a new reader each time) and warm (the daemon's watching reader), p50/p99

Usage: .venv/bin/python bench/deviceplugin.py registry|api|check [options]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import summary
from kubernetes import client as k8s

from nodeagent.config import DevicePlugin
from nodeagent.probes.kube import KubeReader, WatchingReader
from nodeagent.probes.registry import RegistryClient
from tests.kit.apiserver import start_apiserver
from tests.kit.registry_env import start_registry


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
    server = start_apiserver(Path(tempfile.mkdtemp(prefix="nodeagent-bench-dp-")) / "apiserver")
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


def bench_check(n: int) -> None:
    from kubernetes.client import AppsV1Api, CoreV1Api

    from nodeagent.checks.deviceplugin import device_plugin_finding
    from nodeagent.config import parse_config
    from nodeagent.run.deviceplugin import plugin_reader

    root = Path(tempfile.mkdtemp(prefix="nodeagent-bench-check-"))
    reg = start_registry(root)
    server = start_apiserver(root / "apiserver")
    try:
        digest = reg.push_index("rdma/dp", "multi", [("linux", "amd64", ""),
                                                     ("linux", "arm64", "v8")])
        admin = server.client("admin")
        core, apps = CoreV1Api(admin), AppsV1Api(admin)
        core.create_node({"metadata": {"name": "node-a"}})  # type: ignore[arg-type]
        core.create_namespaced_service_account(  # no controller makes it here
            "kube-system", {"metadata": {"name": "default"}})  # type: ignore[arg-type]
        core.patch_node_status("node-a", {"status": {
            "nodeInfo": {"operatingSystem": "linux", "architecture": "amd64"},
            "capacity": {"rdma/rdma_shared_device_a": "8"},
            "allocatable": {"rdma/rdma_shared_device_a": "8"}}},
            _content_type="application/merge-patch+json")
        image = f"{reg.host}/rdma/dp:multi"
        labels = {"app": "rdma-shared-dp-ds"}
        ds = apps.create_namespaced_daemon_set("kube-system", {  # type: ignore[arg-type]
            "metadata": {"name": "rdma-shared-dp-ds"},
            "spec": {"selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels}, "spec": {
                    "tolerations": [{"key": "nodeagent.io/fabric-unready",
                                     "operator": "Exists"}],
                    "containers": [{"name": "dp", "image": image}]}}}})
        pod = core.create_namespaced_pod("kube-system", {  # type: ignore[arg-type]
            "metadata": {"generateName": "dp-", "labels": labels, "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "rdma-shared-dp-ds",
                 "uid": ds.metadata.uid, "controller": True}]},
            "spec": {"nodeName": "node-a", "automountServiceAccountToken": False,
                     "containers": [{"name": "dp", "image": image}]}})
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        core.patch_namespaced_pod_status(pod.metadata.name, "kube-system", {"status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp}],
            "containerStatuses": [{"name": "dp", "image": image, "ready": True,
                                   "restartCount": 0, "state": {"running": {}},
                                   "imageID": f"{reg.host}/rdma/dp@{digest}"}]}},
            _content_type="application/merge-patch+json")
        cfg = parse_config({
            "node_name": "node-a",
            "kubernetes": {"kubeconfig": str(server.kubeconfig("agent-node-a",
                                                                root / "kubeconfig"))},
            "device_plugin": {"registry": {
                "ca_bundle": str(reg.ca),
                "docker_config": str(reg.docker_config(root / "docker.json"))}}})
        dp = cfg.device_plugin
        assert dp is not None

        def check(read: object) -> float:
            t = time.perf_counter()
            finding = device_plugin_finding(cfg, read(dp))  # type: ignore[operator]
            took = (time.perf_counter() - t) * 1000
            assert finding.status == "True" and "verified" in finding.message, finding
            return took

        cold = [check(plugin_reader(cfg)) for _ in range(n)]
        warm_reader = plugin_reader(cfg, on_change=lambda: None)
        check(warm_reader)
        warm = [check(warm_reader) for _ in range(n)]
        print(summary("full check, cold cache", cold),
              " (new reader: 3 GETs, token, manifest)")
        print(summary("full check, warm (daemon)", warm), " (watch cache, digest cache: "
              "no request)")
    finally:
        server.stop()
        reg.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["registry", "api", "check"])
    p.add_argument("-n", type=int, default=200, help="lookups (registry)")
    p.add_argument("--intervals", type=int, default=60, help="intervals (api)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds (api)")
    args = p.parse_args()
    if args.what == "registry":
        bench_registry(args.n)
    elif args.what == "check":
        bench_check(args.n)
    else:
        bench_api(args.intervals, args.interval)


if __name__ == "__main__":
    main()
