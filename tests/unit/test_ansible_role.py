"""The Ansible role without a host: its variables, its derived tables and its rendered config
agree with the agent (the lab applies the role to a real host: tests/lab/test_role.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from nodeagent.config import DEFAULT_RAIL_SYSCTLS, RAIL_SYSCTLS

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "ansible" / "roles" / "nodeagent"
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_argument_spec_defaults_are_the_role_defaults() -> None:
    """ansible-doc shows the spec's defaults; the role uses defaults/main.yml: one value."""
    spec = load(ROLE / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    defaults = load(ROLE / "defaults" / "main.yml")
    for name, option in spec.items():
        assert name.startswith("nodeagent_")
        if "default" in option:
            assert defaults.get(name) == option["default"], name
        elif not option.get("required"):
            assert name in defaults, f"{name}: optional without a default"
    assert set(defaults) <= set(spec), "every default is a documented variable"


def test_role_sysctls_follow_the_agent() -> None:
    family = load(ROLE / "vars" / "main.yml")["nodeagent_sysctl_family"]
    assert family == {k: tree.split("/")[1] for k, (tree, _) in RAIL_SYSCTLS.items()}
    assert load(ROLE / "defaults" / "main.yml")["nodeagent_rail_sysctls"] == DEFAULT_RAIL_SYSCTLS


def test_role_installs_the_repository_unit_into_the_default_venv() -> None:
    shipped = ROLE / "files" / "nodeagent.service"
    assert shipped.resolve() == (ROOT / "units" / "nodeagent.service").resolve()
    slice_ = ROLE / "files" / "nodeagent.slice"
    assert slice_.resolve() == (ROOT / "units" / "nodeagent.slice").resolve()
    venv = load(ROLE / "defaults" / "main.yml")["nodeagent_venv"]
    assert f"ExecStart={venv}/bin/nodeagent run " in shipped.read_text()


TEMPLATES = ["config.yaml.j2", "sysctl-rails.conf.j2", "nm-rails.conf.j2",
             "networkd-rails.network.j2", "nodeagent-ansible.conf.j2"]


def render(tmp_path: Path, variables: dict[str, Any]) -> dict[str, str]:
    """The role's templates rendered by ansible-playbook on this machine (no host)."""
    out = tmp_path / "out"
    out.mkdir(parents=True)
    play = tmp_path / "render.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "all", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable},
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "tasks": [{"ansible.builtin.template": {"src": f"{ROLE}/templates/{{{{ name }}}}",
                                                "dest": f"{out}/{{{{ name }}}}"},
                   "loop": TEMPLATES, "loop_control": {"loop_var": "name"}}],
    }]))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(variables))
    res = subprocess.run([str(PLAYBOOK), "-i", "localhost,", "-e", f"@{extra}", str(play)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ANSIBLE_NOCOLOR": "1"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    files = {p.name: p.read_text() for p in out.iterdir()}
    for name, text in files.items():
        assert "{{" not in text and "{%" not in text, name
    return files


def example_host() -> dict[str, Any]:
    inventory = load(ROOT / "ansible" / "inventory" / "hosts.yml")["gpu_hosts"]
    return {**inventory["vars"], **inventory["hosts"]["gpu-001"]}


def test_example_inventory_renders_a_config_the_agent_accepts(tmp_path: Path) -> None:
    variables = {k: v for k, v in example_host().items() if k.startswith("nodeagent_")}
    variables["nodeagent_kubeconfig_src"] = ""  # a controller-side path: not needed here
    files = render(tmp_path, variables)
    config = tmp_path / "out" / "config.yaml.j2"
    res = subprocess.run([sys.executable, "-m", "nodeagent", "check", "--config-only",
                          "--config", str(config)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    cfg = yaml.safe_load(files["config.yaml.j2"])
    assert cfg["kubernetes"] == {"kubeconfig": "/run/credentials/nodeagent.service/kubeconfig",
                                 "taint": {"key": "nodeagent.io/fabric-unready",
                                           "effect": "NoSchedule"}, "cordon": False}
    assert cfg["device_plugin"]["daemonset"] == "rdma-shared-dp-ds"
    assert cfg["lustre"][0]["mountpoint"] == "/lustre/scratch"
    assert "LoadCredential=kubeconfig:/etc/nodeagent/kubeconfig" in files[
        "nodeagent-ansible.conf.j2"]
    sysctls = [line for line in files["sysctl-rails.conf.j2"].splitlines()
               if line and not line.startswith("#")]
    assert "net.ipv4.conf.ens1f1.arp_announce = 2" in sysctls
    assert "net.ipv6.conf.ens1f0.accept_ra = 0" in sysctls
    assert len(sysctls) == 2 * len(DEFAULT_RAIL_SYSCTLS)
    assert "unmanaged-devices+=interface-name:ens1f0;interface-name:ens1f1" in files[
        "nm-rails.conf.j2"]
    assert "Name=ens1f0 ens1f1" in files["networkd-rails.network.j2"]
    assert "Unmanaged=yes" in files["networkd-rails.network.j2"]


def test_ignore_carrier_mode_and_per_rail_sysctls(tmp_path: Path) -> None:
    rails = [{"name": "r0", "interface": "eth9", "address": "10.0.0.1/24",
              "sysctls": {"rp_filter": 0}}]
    files = render(tmp_path, {"nodeagent_rails": rails,
                              "nodeagent_rail_manager_mode": "ignore-carrier"})
    assert "match-device=interface-name:eth9" in files["nm-rails.conf.j2"]
    assert "ignore-carrier=yes" in files["nm-rails.conf.j2"]
    assert "IgnoreCarrierLoss=yes" in files["networkd-rails.network.j2"]
    assert "Unmanaged" not in files["networkd-rails.network.j2"]
    sysctls = [line for line in files["sysctl-rails.conf.j2"].splitlines()
               if line and not line.startswith("#")]
    assert sysctls == ["net.ipv4.conf.eth9.rp_filter = 0"], "the rail's own list replaces"
    cfg = yaml.safe_load(files["config.yaml.j2"])
    assert "kubernetes" not in cfg and "device_plugin" not in cfg
    assert cfg["metrics"] == {"listen": "127.0.0.1:9464"}


def test_observed_rails_are_left_to_their_owner(tmp_path: Path) -> None:
    """manage: false: the rail is in the agent's config (checked, reported) but the role
    keeps neither NetworkManager nor networkd off it and persists no sysctls for it."""
    rails = [{"name": "r0", "interface": "eth8", "address": "10.0.0.1/24"},
             {"name": "r1", "interface": "eth9", "address": "10.0.1.1/24", "manage": False}]
    files = render(tmp_path, {"nodeagent_rails": rails})
    assert "unmanaged-devices+=interface-name:eth8\n" in files["nm-rails.conf.j2"] + "\n"
    assert "Name=eth8\n" in files["networkd-rails.network.j2"]
    assert "eth9" not in files["sysctl-rails.conf.j2"]
    cfg = yaml.safe_load(files["config.yaml.j2"])
    assert [r.get("manage") for r in cfg["rails"]] == [None, False]
    assert cfg["manage_rails"] is True
    files = render(tmp_path / "second", {"nodeagent_rails": rails,
                                         "nodeagent_manage_rails": False})
    assert "eth8" not in files["sysctl-rails.conf.j2"] + files["nm-rails.conf.j2"]
    assert yaml.safe_load(files["config.yaml.j2"])["manage_rails"] is False



def render_fleet(tmp_path: Path, hosts: dict[str, dict[str, Any]],
                 common: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each host's rendered config, from one play over an inventory of local hosts."""
    out = tmp_path / "out"
    out.mkdir(parents=True)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "hosts": {h: {"ansible_connection": "local", **v} for h, v in hosts.items()},
        "vars": {"ansible_python_interpreter": sys.executable}}}))
    extra = tmp_path / "vars.json"  # as extra vars: above the role's defaults, as in a play
    extra.write_text(json.dumps(common))
    play = tmp_path / "render.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "all", "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "tasks": [{"ansible.builtin.template": {
            "src": f"{ROLE}/templates/config.yaml.j2",
            "dest": f"{out}/{{{{ inventory_hostname }}}}.yaml"}}],
    }]))
    res = subprocess.run([str(PLAYBOOK), "-i", str(inventory), "-e", f"@{extra}", str(play)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ANSIBLE_NOCOLOR": "1"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return {p.stem: yaml.safe_load(p.read_text()) for p in out.iterdir()}


def fleet_host(n: int) -> dict[str, Any]:
    return {"nodeagent_rails": [
        {"name": "rail0", "interface": "ens1f0", "address": f"10.10.0.{n}/24"},
        {"name": "rail1", "interface": "ens1f1", "address": f"10.11.0.{n}/24"}]}


def test_peers_are_rendered_from_the_inventory_as_a_ring(tmp_path: Path) -> None:
    hosts = {f"gpu-{n:03d}": fleet_host(n) for n in range(1, 7)}
    configs = render_fleet(tmp_path, hosts, {"nodeagent_peers": {"gate": False},
                                             "nodeagent_peer_count": 2})
    assert configs["gpu-001"]["peers"] == {"gate": False, "static": {
        "rail0": [{"address": "10.10.0.2", "node": "gpu-002"},
                  {"address": "10.10.0.3", "node": "gpu-003"}],
        "rail1": [{"address": "10.11.0.2", "node": "gpu-002"},
                  {"address": "10.11.0.3", "node": "gpu-003"}]}}
    # The ring wraps: the last hosts probe the first; every host is probed by two.
    assert [p["node"] for p in configs["gpu-006"]["peers"]["static"]["rail0"]] == [
        "gpu-001", "gpu-002"]
    probed = [p["node"] for c in configs.values() for p in c["peers"]["static"]["rail0"]]
    assert sorted(set(probed)) == sorted(hosts) and all(probed.count(h) == 2 for h in hosts)
    for name, cfg in configs.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        res = subprocess.run([sys.executable, "-m", "nodeagent", "check", "--config-only",
                              "--config", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr


def test_no_peers_section_unless_asked_and_a_small_fleet_probes_everyone(
        tmp_path: Path) -> None:
    hosts = {f"gpu-{n:03d}": fleet_host(n) for n in range(1, 4)}
    plain = render_fleet(tmp_path / "plain", hosts, {})
    assert all("peers" not in c for c in plain.values())
    small = render_fleet(tmp_path / "small", hosts, {"nodeagent_peers": {}})
    assert [p["node"] for p in small["gpu-002"]["peers"]["static"]["rail1"]] == [
        "gpu-003", "gpu-001"]
