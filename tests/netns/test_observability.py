"""Metrics and fabric-use evidence from the real daemon in a network namespace.

The rails are real veths: their netdev counters and speed come from the kernel (the
fixture sysfs links `class/net/<rail>` to the namespace's own /sys). Their RDMA port
counters are fixture files the test moves (real RDMA traffic needs the soft-RoCE lab).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from test_daemon import start, status_of

import nodeagent
from tests.kit.helpers import Netns, condition, new_netns, read_status, stop_daemon, wait_for

PORT = 9464  # the namespace has a port space of its own


def link_real_netdevs(sysfs: Path, *ifnames: str) -> None:
    (sysfs / "class" / "net").mkdir(parents=True, exist_ok=True)
    for ifname in ifnames:
        # Resolved by the daemon, inside the namespace: its /sys is the namespace's.
        (sysfs / "class" / "net" / ifname).symlink_to(f"/sys/class/net/{ifname}")


def rdma_counters(sysfs: Path, device: str, words: int) -> None:
    counters = sysfs / "class" / "infiniband" / device / "ports" / "1" / "counters"
    counters.mkdir(parents=True, exist_ok=True)
    (counters / "port_xmit_data").write_text(f"{words}\n")
    (counters / "port_rcv_data").write_text(f"{words}\n")


def scrape(ns: Netns) -> str:
    code = f"import urllib.request; print(urllib.request.urlopen(" \
           f"'http://127.0.0.1:{PORT}/metrics', timeout=5).read().decode())"
    return ns.exec(sys.executable, "-c", code).stdout


def sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{.*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None


def test_metrics_endpoint_and_status_figures(rails_ns: Netns, agent_config: dict[str, Any],
                                             tmp_path: Path) -> None:
    sysfs = Path(agent_config["paths"]["sysfs"])
    link_real_netdevs(sysfs, "r0", "r1")
    rdma_counters(sysfs, "mlx5_0", 1000)
    agent_config["metrics"] = {"listen": f"127.0.0.1:{PORT}"}
    agent_config["resync_interval"] = "1h"
    proc = start(rails_ns, agent_config, tmp_path / "c.yaml")
    try:
        rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0")
        wait_for(lambda: (sample(scrape(rails_ns), "nodeagent_rail_repairs_total",
                                 rail="rail0", kind="AddressMissing") or 0) >= 1,
                 what="the repair counted")
        text = scrape(rails_ns)
        assert sample(text, "nodeagent_condition", condition="RoCENetworkReady",
                      status="True") == 1
        assert sample(text, "nodeagent_condition", condition="RoCENetworkReady",
                      status="False") == 0
        changed = sample(text, "nodeagent_condition_last_transition_timestamp_seconds",
                         condition="FabricReady")
        assert changed is not None and 0 < time.time() - changed < 120, "a Unix timestamp"
        assert sample(text, "nodeagent_rail_gid_index", rail="rail0", device="r0") == \
            sample(text, "nodeagent_rail_gid_index_pinned", rail="rail0", device="r0")
        assert sample(text, "nodeagent_rail_link_speed_bytes", rail="rail0",
                      device="r0") == 10e9 / 8, "a veth says 10000 Mb/s: bytes, as node_exporter"
        assert sample(text, "nodeagent_rail_rdma_transmit_bytes_total", rail="rail0",
                      device="r0") == 4000, "1000 words are 4000 bytes"
        assert sample(text, "nodeagent_rail_carrier_losses_total", rail="rail0",
                      device="r0") == 0
        assert sample(text, "nodeagent_build_info", version=nodeagent.__version__) == 1
        assert (sample(text, "process_resident_memory_bytes") or 0) > 10e6
        assert "_created" not in text, "no _created series"
        assert (sample(text, "nodeagent_probe_duration_seconds_count", probe="netlink")
                or 0) >= 2
        assert (sample(text, "nodeagent_probe_duration_seconds_count", probe="pass") or 0) >= 2
        assert "nodeagent_kube_requests_total" not in text, "no kubernetes section"
        # The status file carries the same figures.
        data = status_of(agent_config)
        assert data is not None
        rail0 = next(r for r in data["rails"] if r["name"] == "rail0")
        assert rail0["repairs_total"]["AddressMissing"] >= 1
        assert rail0["link_speed_mbps"] == 10000 and rail0["rdma_tx_bytes"] == 4000
        assert set(data["probe_seconds"]) >= {"netlink", "gid", "counters"}
        assert re.match(r"\d{4}-\d\d-\d\dT", condition(data, "FabricReady")["since"])
    finally:
        code, log = stop_daemon(proc)
    assert code == 0, log


def test_metrics_port_taken_does_not_stop_the_agent(rails_ns: Netns,
                                                    agent_config: dict[str, Any],
                                                    tmp_path: Path) -> None:
    blocker = subprocess.Popen(
        ["ip", "netns", "exec", rails_ns.name, sys.executable, "-c",
         f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1', {PORT})); s.listen();"
         " print('ok', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert blocker.stdout is not None and blocker.stdout.readline().strip() == "ok"
        agent_config["metrics"] = {"listen": f"127.0.0.1:{PORT}"}
        proc = start(rails_ns, agent_config, tmp_path / "c.yaml")
        code, log = stop_daemon(proc)
        assert code == 0 and f"metrics endpoint 127.0.0.1:{PORT}" in log, log
    finally:
        blocker.kill()


def test_tcp_over_a_rail_with_flat_rdma_counters_is_reported(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path,
) -> None:
    """Real TCP through the rail's veth from a peer namespace; the RDMA counters stay flat:
    TrafficNotOnFabric. Then the RDMA counters move: TrafficOnFabric again."""
    sysfs = Path(agent_config["paths"]["sysfs"])
    link_real_netdevs(sysfs, "r0", "r1")
    rdma_counters(sysfs, "mlx5_0", 0)
    rdma_counters(sysfs, "mlx5_1", 0)
    peer = new_netns()
    try:
        rails_ns.ip("link", "set", "p0", "netns", peer.name)
        peer.ip("addr", "add", "10.10.0.9/24", "dev", "p0")
        peer.ip("link", "set", "p0", "up")
        agent_config["resync_interval"] = "1s"
        agent_config["fabric_traffic"] = {"expect": "always", "window": "3s",
                                          "min_kernel_bytes": 1 << 20}
        proc = start(rails_ns, agent_config, tmp_path / "c.yaml")
        try:
            def traffic() -> tuple[str, str, str]:
                c = condition(status_of(agent_config) or {"conditions": []},
                              "FabricTrafficOnRDMA")
                return c["status"], c["reason"], c["message"]

            wait_for(lambda: traffic()[1] == "TrafficOnFabric", timeout=15,
                     what="quiet rails are fine")
            server = subprocess.Popen(
                ["ip", "netns", "exec", rails_ns.name, sys.executable, "-c", textwrap.dedent("""
                    import socket
                    s = socket.socket(); s.bind(("10.10.0.5", 5001)); s.listen()
                    c, _ = s.accept()
                    while c.recv(1 << 16):
                        pass
                """)])
            try:
                sender = textwrap.dedent("""
                    import socket, time
                    for _ in range(50):
                        try:
                            s = socket.create_connection(("10.10.0.5", 5001)); break
                        except OSError:
                            time.sleep(0.1)
                    end = time.time() + 15
                    while time.time() < end:
                        s.sendall(b"x" * (1 << 20))
                        time.sleep(0.05)
                """)
                client = subprocess.Popen(["ip", "netns", "exec", peer.name, sys.executable,
                                           "-c", sender])
                wait_for(lambda: traffic()[1] == "TrafficNotOnFabric", timeout=12,
                         what="TCP on the rail with flat RDMA counters")
                status, _, message = traffic()
                assert status == "False"
                assert "rail0 r0:" in message and "over RDMA (mlx5_0 port 1)" in message
                assert (status_of(agent_config) or {}).get("ok") is True, \
                    "informational: FabricReady is not affected without gate"
                # RDMA moves too (as when the job uses the fabric): fine again.
                words = 0
                deadline = time.monotonic() + 15
                while traffic()[1] != "TrafficOnFabric" and time.monotonic() < deadline:
                    words += 1000
                    rdma_counters(sysfs, "mlx5_0", words)
                    time.sleep(0.2)
                assert traffic()[1] == "TrafficOnFabric", traffic()
                client.kill()
            finally:
                server.kill()
        finally:
            code, log = stop_daemon(proc)
        assert code == 0, log
    finally:
        peer.delete()


def test_status_of_a_daemon_without_metrics_has_no_endpoint(rails_ns: Netns,
                                                            agent_config: dict[str, Any],
                                                            tmp_path: Path) -> None:
    proc = start(rails_ns, agent_config, tmp_path / "c.yaml")
    try:
        res = rails_ns.exec(sys.executable, "-c",
                            f"import socket; socket.create_connection(('127.0.0.1', {PORT}))",
                            check=False)
        assert res.returncode != 0 and "refused" in res.stderr.lower()
        assert read_status(Path(agent_config["runtime_dir"])) is not None
    finally:
        stop_daemon(proc)


FLOOD = textwrap.dedent("""
    # Idle connections, opened 50 at a time so the accept queue never overflows (a dropped
    # SYN would wait for the kernel's retry): each one the server accepts, it holds.
    import socket, sys, time
    socks = []
    for _ in range(int(sys.argv[1]) // 50):
        for _ in range(50):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", int(sys.argv[2])))  # never waits
            socks.append(s)
        time.sleep(0.05)
    print("open", len(socks), flush=True)
    time.sleep(float(sys.argv[3]))
""")


def test_a_flood_of_idle_metrics_connections_never_blinds_the_agent(
        rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path) -> None:
    """2,000 idle connections against a daemon limited to 64 descriptors: repairs go on,
    the verdict stays True, no traceback, and the endpoint answers once they are gone."""
    from tests.kit.helpers import PYTHON, daemon_log, write_config

    agent_config["metrics"] = {"listen": f"127.0.0.1:{PORT}"}
    agent_config["resync_interval"] = "1s"  # passes (and sysfs reads) all through the flood
    agent_config["repair_guard"] = {"max_repairs": 100}
    path = write_config(tmp_path / "c.yaml", agent_config)
    log_path = tmp_path / "daemon.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["ip", "netns", "exec", rails_ns.name, "prlimit",
                                 "--nofile=64:64", PYTHON, "-m", "nodeagent", "run",
                                 "--config", str(path)], stdout=log, stderr=subprocess.STDOUT,
                                text=True)
    proc.log_path = log_path  # type: ignore[attr-defined]
    rails_ns.daemons.append(proc)
    wait_for(lambda: (status_of(agent_config) or {}).get("ok") is True, timeout=20,
             what="first healthy pass")
    flood = subprocess.Popen(["ip", "netns", "exec", rails_ns.name, "prlimit",
                              "--nofile=4096:4096", PYTHON, "-c", FLOOD, "2000", str(PORT),
                              "20"], stdout=subprocess.PIPE, text=True)
    try:
        assert flood.stdout is not None and flood.stdout.readline().startswith("open 2000")
        time.sleep(3.0)  # the accepted connections sit idle; an unlimited endpoint holds
        #   every one of them (measured: 64 of 64 descriptors, and no pass completes)
        passes = status_of(agent_config)["daemon"]["passes"]  # type: ignore[index]
        for _ in range(3):
            rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0")
            wait_for(lambda: rails_ns.addresses("r0") == ["10.10.0.5/24"],
                     what="address restored during the flood")
            time.sleep(1.0)
        data = wait_for(lambda: (d := status_of(agent_config))
                        and d["daemon"]["passes"] > passes + 2 and d, what="passes go on")
        assert data["ok"] is True, data["conditions"]
        assert not [e for e in data["errors"] if "descriptor" in e], data["errors"]
    finally:
        flood.kill()
        flood.wait()
    text = wait_for(lambda: scrape(rails_ns), timeout=20, what="the endpoint answers again")
    assert sample(text, "nodeagent_condition", condition="FabricReady", status="True") == 1.0
    code, out = stop_daemon(proc)
    assert code == 0, out
    assert "Traceback" not in daemon_log(proc), daemon_log(proc)[-3000:]
