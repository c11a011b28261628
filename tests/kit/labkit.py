"""What the lab scenarios do in the guest: GID tables, QP holders, network managers, the
agent as its systemd service."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.kit.helpers import wait_for
from tests.kit.vm import VM

# A look into a guest costs it about 250 ms of host CPU (an ssh session and a command under
# emulation): looks back to back kept an idle guest at 114 % of a host core, looks 0.5 s
# apart at 41 % (7 % untouched). The scenarios look twice a second, leaving the CPU to the
# agent they watch and to the other guests beside them.
GUEST_POLL = 0.5


def wait_guest(predicate: Callable[[], Any], timeout: float = 10.0,
               what: str = "condition") -> Any:
    """wait_for at a guest's pace (GUEST_POLL)."""
    return wait_for(predicate, timeout, what, interval=GUEST_POLL)


RAILS = [
    {"name": "rail0", "interface": "ens4", "address": "10.10.0.5/24", "table": 100,
     "rule_priority": 1000, "rdma_device": "rxe0"},
    {"name": "rail1", "interface": "ens5", "address": "10.11.0.5/24", "table": 101,
     "rule_priority": 1001, "rdma_device": "rxe1"},
]
VENV = "/opt/nodeagent/venv/bin"
ROOT = Path(__file__).resolve().parents[2]
GUEST = ROOT / "tests" / "lab" / "guest"  # the helper scripts, copied to /root/guest
UNIT = ROOT / "units" / "nodeagent.service"
SLICE = ROOT / "units" / "nodeagent.slice"


def sysfs_gids(vm: VM, device: str) -> dict[int, str]:
    """Non-zero GIDs of port 1 by index, read from sysfs in the guest."""
    out = vm.ssh(f"cd /sys/class/infiniband/{device}/ports/1/gids && grep -H . *").stdout
    table = {}
    for line in out.splitlines():
        index, _, gid = line.partition(":")
        if gid.strip() and set(gid.replace(":", "").strip()) != {"0"}:
            table[int(index)] = gid.strip()
    return table


def ipv4_gid_index(vm: VM, device: str, address: str) -> int | None:
    hexes = "".join(f"{int(o):02x}" for o in address.split("."))
    want = f"0000:0000:0000:0000:0000:ffff:{hexes[:4]}:{hexes[4:]}"
    return next((i for i, g in sysfs_gids(vm, device).items() if g == want), None)


def pyverbs_and_sysfs(vm: VM) -> tuple[list[Any], list[Any]]:
    """The agent's own readers, both, in the guest: (pyverbs entries, sysfs entries)."""
    code = ("import json; from pathlib import Path; from nodeagent.probes.gid import "
            "read_gid_table as r; "
            "f=lambda s: sorted([e.device, e.port, e.index, e.gid, e.gid_type.value, e.ndev] "
            "for e in r(s, Path('/sys')).entries); "
            "print(json.dumps([f('pyverbs'), f('sysfs')]))")
    got = json.loads(vm.ssh(f'{VENV}/python -c "{code}"').stdout)
    return got[0], got[1]


def hold_qp(vm: VM, device: str, gid_index: int) -> None:
    """A live RC QP pair on the GID (guest/qp_holder.py), until pkill."""
    vm.ssh(f"nohup python3 /root/guest/qp_holder.py {device} {gid_index} "
           f"> /root/holder-{device}.log 2>&1 &")
    wait_guest(lambda: "ready" in vm.ssh(f"cat /root/holder-{device}.log").stdout, 30,
               "the QP holder in RTS")


def busy_guest(vm: VM, seconds: int = 120, processes: int = 2) -> None:
    """CPU-bound shell loops on every vCPU of the guest, as on a GPU node whose CPUs are busy
    by design; they end by themselves after `seconds` (and at the guest fixture's reset)."""
    vm.ssh(" ".join(f"nohup timeout {seconds} sh -c ': busy-guest; while :; do :; done' "
                    ">/dev/null 2>&1 &" for _ in range(processes)))


def nm_static(vm: VM, ifname: str, address: str, extra: str = "") -> None:
    """NetworkManager manages `ifname` with a static IPv4 profile."""
    name = f"rail-{ifname}"
    vm.ssh(f"cat > /etc/NetworkManager/system-connections/{name}.nmconnection <<'EOF'\n"
           f"[connection]\nid={name}\ntype=ethernet\ninterface-name={ifname}\n\n"
           f"[ipv4]\nmethod=manual\naddress1={address}\n\n[ipv6]\nmethod=ignore\nEOF\n"
           f"chmod 600 /etc/NetworkManager/system-connections/{name}.nmconnection")
    if extra:
        vm.write("/etc/NetworkManager/conf.d/20-rails.conf", extra)
        vm.ssh("systemctl reload NetworkManager")
    vm.ssh(f"nmcli device set {ifname} managed yes; nmcli connection reload; "
           f"nmcli connection up {name}")


def addresses(vm: VM, ifname: str) -> list[str]:
    data = json.loads(vm.ssh(f"ip -j -4 addr show dev {ifname}").stdout or "[]")
    return [f"{a['local']}/{a['prefixlen']}" for d in data for a in d.get("addr_info", [])]


def rule_priorities(vm: VM) -> set[int]:
    return {r.get("priority") for r in json.loads(vm.ssh("ip -j rule show").stdout)}


SETTLED = ("active", "failed", "inactive")  # a unit's ActiveStates that end a restart


def restart_networkd(vm: VM, attempts: int = 3, fresh_socket: bool = False) -> None:
    """Restart systemd-networkd without holding an ssh session across it: the restart is
    queued (--no-block) and then polled with short commands, each of which reconnects if
    the management link was busy. A session held across the restart was seen to hang for
    the whole ssh timeout on a loaded host (scenario 2c, 120 s). On a starved guest (three
    emulated guests and a cold CI's Go builds on 2 cores) networkd's own start was seen to
    time out (its bus connection not authenticated within 30 s, the start job's 90 s
    spent), and once a restart did not settle within 240 s at all (the last look's words
    were lost: they are kept now): either is tried again, up to `attempts` in all, and the
    failure says what each attempt ended in.

    networkd's netlink socket belongs to its socket unit (PID 1 holds it, 128 MB of receive
    buffer) and a restart inherits whatever is queued on it. A networkd that fought the agent
    over a rail both configure (scenario 2c's first half) was seen to send 65,535 address
    requests in seconds (its own limit: "Failed to configure address: Numerical result out
    of range"): 57 MB of answers queued, which the next networkd drained for minutes at 100 %
    of an emulated CPU, past every restart's 240 s. `fresh_socket` (and every retry) kills
    networkd and restarts its socket unit too, which drops that queue."""
    seen = "nothing yet"  # what the last look saw, for the failure

    def settled() -> str | None:
        nonlocal seen
        res = vm.ssh("systemctl show -p ActiveState --value systemd-networkd; "
                     "systemctl list-jobs --no-legend systemd-networkd.service",
                     check=False, timeout=30)
        seen = f"exit {res.returncode}: {(res.stdout + res.stderr).strip()[-300:]!r}"
        lines = res.stdout.splitlines()
        pending = [line for line in lines[1:] if "networkd" in line]  # a job still queued
        state = lines[0].strip() if lines and res.returncode == 0 else ""
        # "activating" with no job is systemd's own restart after a failed start (the
        # unit's Restart=), seen in a rehearsal 3 s before networkd came up: still under way.
        return state if state in SETTLED and not pending else None

    states: list[str] = []
    for attempt in range(attempts):
        if fresh_socket or attempt:
            vm.ssh("systemctl kill -s KILL systemd-networkd; systemctl stop "
                   "systemd-networkd.socket systemd-networkd 2>/dev/null; systemctl "
                   "reset-failed systemd-networkd 2>/dev/null; systemctl start "
                   "systemd-networkd.socket; systemctl start --no-block systemd-networkd")
        else:
            vm.ssh("systemctl reset-failed systemd-networkd 2>/dev/null; "
                   "systemctl restart --no-block systemd-networkd")
        try:
            state = wait_guest(settled, 240, "systemd-networkd's restart to settle")
        except AssertionError:  # a restart that never settled is tried again, like a failed one
            state = f"not settled in 240 s (last look: {seen})"
        if state == "active":
            return
        states.append(state)
    journal = vm.ssh("journalctl -u systemd-networkd -n 20 --no-pager", check=False).stdout
    raise AssertionError(f"systemd-networkd after {attempts} restarts: {states}\n{journal}")


def start_agent(vm: VM, **extra: Any) -> None:
    """The agent as its systemd service, configured for both rails."""
    cfg = {"node_name": "lab", "rails": RAILS, "gid_source": "pyverbs",
           "resync_interval": "30s", **extra}
    vm.write("/etc/nodeagent/config.yaml", yaml.safe_dump(cfg))
    vm.ssh("systemctl start nodeagent", timeout=180)


def status(vm: VM) -> dict[str, Any]:
    """The running agent's status file. Read directly: `nodeagent status` costs a Python
    start of seconds in the emulated guest, and the scenarios look often (the role's test
    runs the command itself)."""
    res = vm.ssh("cat /run/nodeagent/status.json", check=False)
    return json.loads(res.stdout) if res.stdout.strip() else {}


def condition(vm: VM, ctype: str) -> tuple[str, str]:
    for c in status(vm).get("conditions", []):
        if c["type"] == ctype:
            return c["status"], c["reason"]
    return "", ""


def ensure_agent(vm: VM) -> None:
    """The agent installed the way a host gets it: a wheel into /opt/nodeagent/venv
    (--system-site-packages: the distro's pyverbs), the unit in /etc/systemd/system."""
    if vm.ssh("test -x /opt/nodeagent/venv/bin/nodeagent && "
              "test -e /etc/systemd/system/nodeagent.service && "
              "test -e /etc/systemd/system/nodeagent.slice", check=False).returncode == 0:
        return
    vm.put(UNIT, "/etc/systemd/system/nodeagent.service")
    vm.put(SLICE, "/etc/systemd/system/nodeagent.slice")
    vm.ssh("python3 -m venv --system-site-packages --without-pip /opt/nodeagent/venv && "
           "/opt/nodeagent/venv/bin/python -m pip install -q --no-compile --no-index "
           "--find-links /root/wheels nodeagent", timeout=600)
    vm.ssh("systemctl daemon-reload")
