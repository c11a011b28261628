"""The Ansible role applied to the lab guest over ssh, as a platform team's provisioning
would: a bad inventory fails before any change, the first run installs and starts the agent
(active only after its first pass) with the host settings that prevent the incidents, the
second run changes nothing, a config the agent rejects is never put in place."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kit.labkit import RAILS
from tests.kit.vm import VM

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
PLAYBOOK = ROOT / ".venv" / "bin" / "ansible-playbook"
# The kubelet's config as a cluster installer leaves it, with a taint of someone else's.
KUBELET = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
           "registerWithTaints": [{"key": "example.com/gpu-burnin", "effect": "NoSchedule"}]}
GOOD = {
    "nodeagent_rails": RAILS,
    "nodeagent_node_name": "lab",
    "nodeagent_gid_source": "pyverbs",
    "nodeagent_pip_extra_args": "--no-index --find-links /root/wheels --no-compile",
    "nodeagent_apt_update_cache": False,  # the guest reaches nothing but the test's host
    "nodeagent_config_extra": {"resync_interval": "30s"},
}
ROLE_FILES = ["/etc/NetworkManager/conf.d/90-nodeagent-rails.conf",
              "/etc/systemd/networkd.conf.d/90-nodeagent.conf",
              "/etc/systemd/network/05-nodeagent-rails.network",
              "/etc/sysctl.d/90-nodeagent-rails.conf"]


class Play:
    def __init__(self, vm: VM, workdir: Path) -> None:
        self.workdir = workdir
        self.inventory = workdir / "inventory.yml"
        self.inventory.write_text(yaml.safe_dump({"gpu_hosts": {"hosts": {"lab": {
            "ansible_host": "127.0.0.1", "ansible_port": vm.ssh_port, "ansible_user": "root",
            "ansible_become": False,  # already root; the guest has no sudo
            "ansible_ssh_private_key_file": str(vm.image.key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no "
                                       "-o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": "/usr/bin/python3",
        }}}}))

    def run(self, variables: dict[str, Any], start_at: str | None = None,
            ) -> tuple[int, dict[str, int], str]:
        """(exit code, the recap's counters for the guest, the whole output)."""
        extra = self.workdir / "vars.json"
        extra.write_text(json.dumps(variables))
        env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"),
               "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOG_PATH": str(self.workdir / "ansible.log")}
        args = [str(PLAYBOOK), "-i", str(self.inventory), "-e", f"@{extra}"]
        if start_at:
            args += ["--start-at-task", start_at]
        started = time.monotonic()
        # A guard against a hung play, not a time limit: the first play in an emulated
        # guest took 15 min on a fresh machine with the Go builds and the other guests
        # beside it (its pip install alone 5.5 min), past the 900 s this guard had.
        res = subprocess.run([*args, str(ANSIBLE / "playbook.yml")], capture_output=True,
                             text=True, env=env, cwd=ANSIBLE, timeout=2400,
                             stdin=subprocess.DEVNULL)
        out = res.stdout + res.stderr
        print(f"ansible-playbook: exit {res.returncode} in {time.monotonic() - started:.1f}s")
        recap = re.search(r"^lab\s+:\s+(.*)$", out, re.M)
        counters = ({k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", recap.group(1))}
                    if recap else {})
        return res.returncode, counters, out


@pytest.fixture
def bare(lab: VM) -> Iterator[VM]:
    """The guest without the agent (no venv, unit or config), with a kubelet config. After
    the test the role's host settings are removed and the agent stopped, but left installed
    for the scenarios."""
    settings = ("systemctl stop nodeagent; systemctl disable nodeagent; "
                "rm -rf /etc/nodeagent /etc/systemd/system/nodeagent.service.d "
                "/var/lib/kubelet " + " ".join(ROLE_FILES) + "; systemctl daemon-reload; "
                "systemctl reload NetworkManager; networkctl reload; true")
    lab.ssh(settings + "; rm -rf /opt/nodeagent/venv /etc/systemd/system/nodeagent.service "
            "/var/cache/nodeagent; systemctl daemon-reload")
    lab.write("/var/lib/kubelet/config.yaml", yaml.safe_dump(KUBELET))
    try:
        yield lab
    finally:
        lab.ssh(settings)


def test_a_guest_command_leaves_this_process_stdin_blocking(lab: VM) -> None:
    """ssh makes its stdin non-blocking while it runs. A guest command that shared this
    process's stdin did that to ansible-playbook's too (the peer node boots beside the role's
    test): "Ansible requires blocking IO on stdin", and CI was red. Each command here runs
    while this process's stdin is a pipe, watched for O_NONBLOCK until the command ends."""
    read_end, write_end = os.pipe()
    saved = os.dup(0)
    os.dup2(read_end, 0)
    seen = []
    try:
        running = threading.Thread(target=lab.ssh, args=("sleep 3",))
        running.start()
        while running.is_alive():
            seen.append(bool(fcntl.fcntl(0, fcntl.F_GETFL) & os.O_NONBLOCK))
            time.sleep(0.02)
        running.join()
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    assert seen and not any(seen), f"stdin non-blocking in {sum(seen)} of {len(seen)} looks"


def test_role_installs_the_agent_and_settings_then_changes_nothing(
    bare: VM, tmp_path: Path,
) -> None:
    play = Play(bare, tmp_path)

    # 1. A bad inventory fails before the host is touched, naming the variable.
    for bad, named in [
        ({**GOOD, "nodeagent_rails": [{"name": "rail0", "interface": "ens4"}]},
         "address"),
        ({**GOOD, "nodeagent_rail_manager_mode": "sideways"}, "nodeagent_rail_manager_mode"),
        ({**GOOD, "nodeagent_rails": [{**RAILS[0], "address": "10.10.0.5"}]},
         "nodeagent_rails[0] (rail0): address must be IPv4 with a prefix length"),
    ]:
        code, recap, out = play.run(bad)
        assert code != 0 and recap.get("failed") == 1 and recap.get("changed") == 0, out
        assert named in out, out
        assert "Install the OS packages" not in out, "failed before the first change"
    assert bare.ssh("ls /opt/nodeagent/venv /etc/nodeagent /etc/sysctl.d/90-nodeagent-rails.conf"
                    " 2>/dev/null", check=False).stdout == "", "nothing was installed"

    # 2. The first run installs everything; the unit is active after the agent's first pass.
    code, recap, out = play.run(GOOD)
    assert code == 0 and recap["changed"] > 0 and recap["failed"] == 0, out
    assert bare.ssh("systemctl is-active nodeagent; systemctl is-enabled nodeagent"
                    ).stdout.split() == ["active", "enabled"]
    # The default install path: the wheel built from this checkout on the controller.
    assert bare.ssh("ls /var/cache/nodeagent").stdout.strip().startswith("nodeagent-"), \
        "the role's own wheel was installed"
    state = json.loads(bare.ssh("/opt/nodeagent/venv/bin/nodeagent status --json").stdout)
    assert state["daemon"]["passes"] >= 1 and state["ok"], state
    assert state["daemon"]["running"] and not state["daemon"]["stale"], state
    config = yaml.safe_load(bare.ssh("cat /etc/nodeagent/config.yaml").stdout)
    assert config["rails"] == RAILS and config["node_name"] == "lab"
    assert config["resync_interval"] == "30s" and "kubernetes" not in config
    nm = bare.ssh("nmcli -t -f DEVICE,STATE device status").stdout
    assert "ens4:unmanaged" in nm and "ens5:unmanaged" in nm, nm
    assert "ManageForeignRoutingPolicyRules=no" in bare.ssh(
        "cat /etc/systemd/networkd.conf.d/90-nodeagent.conf").stdout
    assert "unmanaged" in bare.ssh("networkctl list ens4 --no-legend").stdout
    assert bare.ssh("sysctl -n net.ipv4.conf.ens5.arp_announce net.ipv6.conf.ens4.accept_ra"
                    ).stdout.split() == ["2", "0"]
    kubelet = yaml.safe_load(bare.ssh("cat /var/lib/kubelet/config.yaml").stdout)
    assert kubelet["registerWithTaints"] == [
        KUBELET["registerWithTaints"][0],  # someone else's, kept
        {"key": "nodeagent.io/fabric-unready", "value": "AgentStarting",
         "effect": "NoSchedule"}]
    assert kubelet["kind"] == "KubeletConfiguration"

    # 3. Idempotent: the second run changes nothing (and restarts nothing).
    pid = bare.ssh("systemctl show -p MainPID --value nodeagent").stdout.strip()
    code, recap, out = play.run(GOOD)
    assert code == 0 and recap["changed"] == 0, out
    assert bare.ssh("systemctl show -p MainPID --value nodeagent").stdout.strip() == pid

    # 4. A config the agent rejects is never put in place; the running agent is untouched.
    before = bare.ssh("sha256sum /etc/nodeagent/config.yaml").stdout
    code, recap, out = play.run({**GOOD, "nodeagent_config_extra": {
        "link_flap": {"max_flaps": 0}}}, start_at="Write the agent's config")
    assert code != 0 and recap["failed"] == 1, out
    assert "link_flap.max_flaps" in out, out  # the agent's own one-line message
    assert bare.ssh("sha256sum /etc/nodeagent/config.yaml").stdout == before
    assert bare.ssh("systemctl show -p MainPID --value nodeagent").stdout.strip() == pid

    # 5. The hardening figure, as the host's own systemd sees the installed unit.
    security = bare.ssh("systemd-analyze security nodeagent.service --no-pager",
                        check=False).stdout
    exposure = re.search(r"Overall exposure level for nodeagent.service: ([0-9.]+)", security)
    assert exposure, security[-1500:]
    print(f"systemd-analyze security (guest, systemd 252): {exposure.group(1)}")
    assert float(exposure.group(1)) <= 3.0

