"""A guided tour: two RoCE rails in a throwaway network namespace, broken and repaired.

Run as root through `tools/demo` (which installs what it needs first). Everything happens
inside a namespace this script creates and deletes; the host's own network is not touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.kit.helpers import make_gid_tree, roce_entries  # the fixture GID tree writer

NS = f"nodeagent-demo-{os.getpid()}"
PY = sys.executable


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def run(*cmd: str, show: bool = True, check: bool = True) -> subprocess.CompletedProcess[str]:
    if show:
        print(f"$ {' '.join(cmd)}", flush=True)
    res = subprocess.run(["ip", "netns", "exec", NS, *cmd], text=True, capture_output=True)
    if show and (res.stdout or res.stderr):
        print((res.stdout + res.stderr).rstrip(), flush=True)
    if check and res.returncode not in (0, 1):
        raise SystemExit(f"demo: {' '.join(cmd)} failed: {res.stderr.strip()}")
    return res


def nodeagent(*args: str) -> subprocess.CompletedProcess[str]:
    print(f"$ nodeagent {' '.join(args)}", flush=True)
    res = run(PY, "-m", "nodeagent", *args, show=False)
    print((res.stdout + res.stderr).rstrip(), flush=True)
    print(f"(exit {res.returncode})", flush=True)
    return res


def wait_repaired(what: str, probe: list[str], want: str) -> None:
    start = time.monotonic()
    while time.monotonic() - start < 10:
        if want in run(*probe, show=False).stdout:
            print(f"   -> {what} back after {1000 * (time.monotonic() - start):.0f} ms "
                  "(measured by this script's polling, so an upper bound)", flush=True)
            return
        time.sleep(0.005)
    raise SystemExit(f"demo: {what} was not repaired within 10 s")


def main() -> int:
    if os.geteuid() != 0:
        print("demo: run as root (it creates a network namespace)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="nodeagent-demo-"))
    subprocess.run(["ip", "netns", "add", NS], check=True)
    daemon: subprocess.Popen[str] | None = None
    try:
        say(f"A throwaway namespace {NS} with two veth 'rails' (demo0, demo1)")
        for rail, peer in (("demo0", "peer0"), ("demo1", "peer1")):
            run("ip", "link", "add", "name", rail, "type", "veth", "peer", "name", peer,
                show=False)
            run("ip", "link", "set", peer, "up", show=False)
        sysfs = work / "sys"
        make_gid_tree(sysfs, "mlx5_0", roce_entries("demo0", "10.10.0.5"))
        make_gid_tree(sysfs, "mlx5_1", roce_entries("demo1", "10.11.0.5"))
        config = work / "config.yaml"
        config.write_text(f"""\
node_name: demo-node
paths:
  sysfs: {sysfs}     # no RDMA NIC here: a recorded mlx5-like GID table stands in
state_dir: {work}/state
runtime_dir: {work}/run
rails:
  - {{name: rail0, interface: demo0, address: 10.10.0.5/24, mtu: 4200,
     table: 100, rule_priority: 1000, gateway: 10.10.0.1}}
  - {{name: rail1, interface: demo1, address: 10.11.0.5/24, mtu: 4200,
     table: 101, rule_priority: 1001}}
""")
        print(config.read_text())

        say("check: evaluate everything, change nothing (the rails are bare)")
        nodeagent("check", "--config", str(config))

        say("apply --dry-run: the exact repairs, still changing nothing")
        nodeagent("apply", "--dry-run", "--config", str(config))

        say("run: the daemon repairs at once, then reacts to netlink events")
        log = open(work / "daemon.log", "w")  # noqa: SIM115 (closed in finally)
        daemon = subprocess.Popen(
            ["ip", "netns", "exec", NS, PY, "-m", "nodeagent", "run", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT, text=True)
        status = work / "run" / "status.json"
        for _ in range(500):
            if status.exists() and json.loads(status.read_text()).get("ok"):
                break
            time.sleep(0.02)
        nodeagent("status", "--config", str(config))

        say("Break things the way incidents do; the daemon puts them back")
        breaks = [
            (["ip", "addr", "del", "10.10.0.5/24", "dev", "demo0"], "address",
             ["ip", "-br", "addr", "show", "dev", "demo0"], "10.10.0.5/24"),
            (["ip", "rule", "del", "priority", "1001"], "policy rule",
             ["ip", "rule"], "1001:"),
            (["ip", "route", "flush", "table", "100"], "default route in table 100",
             ["ip", "route", "show", "table", "100"], "default via 10.10.0.1"),
            (["ip", "link", "set", "demo1", "mtu", "1500"], "MTU 4200",
             ["ip", "link", "show", "dev", "demo1"], "mtu 4200"),
        ]
        for cmd, what, probe, want in breaks:
            run(*cmd)
            wait_repaired(what, probe, want)

        say("Carrier loss (peer down) is reported, and never costs the address")
        run("ip", "link", "set", "peer0", "down")
        time.sleep(0.3)
        nodeagent("status", "--config", str(config))
        run("ip", "-br", "addr", "show", "dev", "demo0")
        run("ip", "link", "set", "peer0", "up")
        time.sleep(0.3)

        say("SIGTERM: the daemon finishes its step, writes its status and exits 0")
        daemon.send_signal(signal.SIGTERM)
        print(f"daemon exit code: {daemon.wait(timeout=20)}")
        daemon = None
        print("daemon log:\n" + (work / "daemon.log").read_text())
        return 0
    finally:
        if daemon is not None:
            daemon.kill()
        subprocess.run(["ip", "netns", "del", NS], check=False)
        print(f"\n(namespace {NS} deleted; files kept in {work})")


if __name__ == "__main__":
    sys.exit(main())
