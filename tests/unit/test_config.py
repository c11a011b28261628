from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config import ConfigError, load_config, parse_config, parse_duration

RAIL = {"name": "rail0", "interface": "ens1f0", "address": "10.10.0.5/24"}


def problems(data: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.problems


def test_minimal_config_defaults() -> None:
    cfg = parse_config({"rails": [RAIL]})
    assert cfg.resync_interval == 30.0
    assert str(cfg.state_dir) == "/var/lib/nodeagent"
    assert str(cfg.runtime_dir) == "/run/nodeagent"
    assert cfg.kubernetes is None and cfg.lustre is None and cfg.device_plugin is None
    assert cfg.sysctls_for(cfg.rails[0]) == {
        "arp_ignore": 1, "arp_announce": 2, "rp_filter": 2, "accept_ra": 0}
    assert cfg.rails[0].ip == "10.10.0.5" and cfg.rails[0].network == "10.10.0.0/24"


def test_empty_file_is_a_valid_local_only_config() -> None:
    cfg = parse_config(None)
    assert cfg.rails == []


def test_design_example_config_is_valid() -> None:
    cfg = parse_config({
        "node_name": "gpu-01",
        "paths": {"sysfs": "/sys", "procfs": "/proc"},
        "state_dir": "/var/lib/nodeagent",
        "runtime_dir": "/run/nodeagent",
        "rails": [{"name": "rail0", "interface": "ens1f0", "address": "10.10.0.5/24",
                   "mtu": 4200, "table": 100, "rule_priority": 1000, "gateway": "10.10.0.1",
                   "gid_index": 3}],
        "gid_source": "auto",
        "device_plugin": {"namespace": "kube-system", "daemonset": "rdma-shared-dp-ds",
                          "resource": "rdma/rdma_shared_device_a", "min_allocatable": 1},
        "lustre": [{"mountpoint": "/lustre/scratch", "source": "10.0.0.1@o2ib:/scratch",
                    "timeout": "5s"}],
        "kubernetes": {"kubeconfig": "/etc/nodeagent/kubeconfig",
                       "taint": {"key": "example.com/fabric", "effect": "NoSchedule"},
                       "cordon": False, "clear_after": "30s"},
    })
    assert cfg.lustre is not None and cfg.lustre[0].timeout == 5.0
    assert cfg.kubernetes is not None and cfg.kubernetes.clear_after == 30.0


@pytest.mark.parametrize(
    ("rail_patch", "expected"),
    [
        ({"address": "10.0.0.300/24"},
         "rails[0].address: '10.0.0.300/24' is not an IPv4 interface address"),
        ({"address": "10.0.0.3"},
         "rails[0].address: '10.0.0.3' has no prefix length (e.g. 10.10.0.5/24)"),
        ({"interface": "way-too-long-interface"},
         "rails[0].interface: 'way-too-long-interface' is not a valid interface name "
         "(longer than 15 bytes)"),
        ({"gateway": "10.10.0.999", "table": 100},
         "rails[0].gateway: '10.10.0.999' is not an IPv4 address"),
        ({"table": 254},
         "rails[0].table: 254 is reserved or out of range (use 1..252 or 256..4294967295)"),
        ({"mtu": 10}, "rails[0].mtu: Input should be greater than or equal to 68 (got 10)"),
        ({"colour": "blue"}, "rails[0].colour: unknown key"),
        # Accepted before, each a rail that cannot work (or writes every interface's
        # sysctls): refused in one line.
        ({"address": "10.10.0.5/0"},
         "rails[0].address: '10.10.0.5/0': a /0 prefix makes every address the rail's subnet"),
        ({"address": "10.10.0.0/24"},
         "rails[0].address: '10.10.0.0/24' is the network address of 10.10.0.0/24"),
        ({"address": "10.10.0.255/24"},
         "rails[0].address: '10.10.0.255/24' is the broadcast address of 10.10.0.0/24"),
        ({"address": "127.0.0.5/8"},
         "rails[0].address: '127.0.0.5/8' is a loopback address, not a host's"),
        ({"address": "224.0.0.5/24"},
         "rails[0].address: '224.0.0.5/24' is a multicast address, not a host's"),
        ({"address": "0.0.0.0/8"},
         "rails[0].address: '0.0.0.0/8' is an unspecified address, not a host's"),
        ({"interface": "lo"}, "rails[0].interface: 'lo' cannot be a rail (the loopback, or "
                              "the sysctl tree of every interface)"),
        ({"interface": "all"}, "rails[0].interface: 'all' cannot be a rail (the loopback, or "
                               "the sysctl tree of every interface)"),
        ({"table": 100, "gateway": "10.10.0.255"},
         "rails[0].gateway: 10.10.0.255 is the network or broadcast address of 10.10.0.0/24"),
        ({"table": 100, "gateway": "10.10.0.0"},
         "rails[0].gateway: 10.10.0.0 is the network or broadcast address of 10.10.0.0/24"),
        ({"sysctls": {"rp_filter": 7}}, "rails[0].sysctls: rp_filter=7 is out of range 0..2"),
        ({"sysctls": {"forwarding": 1}},
         "rails[0].sysctls: unknown rail sysctl 'forwarding' (known: accept_ra, "
         "addr_gen_mode, arp_announce, arp_ignore, disable_ipv6, rp_filter)"),
    ],
)
def test_rail_field_errors(rail_patch: dict[str, Any], expected: str) -> None:
    assert problems({"rails": [{**RAIL, **rail_patch}]}) == [expected]


def test_missing_required_keys() -> None:
    assert problems({"rails": [{"name": "rail0"}]}) == [
        "rails[0].interface: required key is missing",
        "rails[0].address: required key is missing",
    ]


def test_every_problem_reported_at_once() -> None:
    got = problems({"rails": [RAIL, {**RAIL, "name": "rail1", "address": "bad"}],
                    "resync_interval": "soon", "bogus": 1})
    # In the order the keys are documented, whatever order the file has them in.
    assert got == [
        "resync_interval: 'soon' is not a duration (use e.g. 30s, 500ms, 2m, 1h30m, 1d)",
        "rails[1].address: 'bad' has no prefix length (e.g. 10.10.0.5/24)",
        "bogus: unknown key",
    ]


def test_duplicates() -> None:
    got = problems({"rails": [
        {**RAIL, "table": 100},
        {**RAIL, "table": 100},
    ]})
    assert got == [
        "rails[1].name: 'rail0' duplicates rails[0].name",
        "rails[1].interface: 'ens1f0' duplicates rails[0].interface",
        "rails[1].address: '10.10.0.5' duplicates rails[0].address",
        "rails[1].table: 100 duplicates rails[0].table",
    ]


def test_duplicate_address_with_other_prefix() -> None:
    other = {"name": "r1", "interface": "ens2", "address": "10.10.0.5/16"}
    got = problems({"rails": [RAIL, other]})
    assert got == ["rails[1].address: '10.10.0.5' duplicates rails[0].address"]


def test_overlapping_rail_subnets() -> None:
    wide = {"name": "r1", "interface": "ens2", "address": "10.10.1.5/16"}
    apart = {"name": "r2", "interface": "ens3", "address": "10.12.0.5/24"}
    assert problems({"rails": [RAIL, wide, apart]}) == [
        "rails[1].address: subnet 10.10.0.0/16 overlaps rails[0]'s 10.10.0.0/24"]


def test_rule_priority_and_gateway_need_a_table() -> None:
    got = problems({"rails": [{**RAIL, "rule_priority": 1000, "gateway": "10.10.0.1"}]})
    assert got == [
        "rails[0].rule_priority: set without rails[0].table",
        "rails[0].gateway: set without rails[0].table",
    ]


def test_gateway_outside_subnet() -> None:
    got = problems({"rails": [{**RAIL, "table": 100, "gateway": "10.99.0.1"}]})
    assert got == ["rails[0].gateway: 10.99.0.1 is outside the rail subnet 10.10.0.0/24"]


def test_unknown_top_level_and_nested_keys() -> None:
    got = problems({"kubernetes": {"taint": {"key": "k", "effekt": "NoSchedule"}},
                    "gid_source": "magic"})
    assert got == [
        "gid_source: Input should be 'auto', 'pyverbs' or 'sysfs' (got 'magic')",
        "kubernetes.taint.effekt: unknown key",
    ]


def test_top_level_must_be_a_mapping() -> None:
    assert problems(["rails"]) == ["(top level): expected a mapping of keys, got list"]


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0), (5, 5.0), ("1.5", 1.5),
    ("1m30s", 90.0), ("1h30m", 5400.0), ("1d", 86400.0), ("1d12h", 129600.0),
    ("2m0.5s", 120.5), ("1s500ms", 1.5), (" 1h30m ", 5400.0)])
def test_durations(text: Any, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1h1h", "1h 30m", "h", "1x", "30s-", "1.5.5s", "m30",
                                  "1d1h1m1s1ms1s"])
def test_durations_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


def test_resync_interval_floor() -> None:
    assert problems({"resync_interval": "100ms"}) == [
        "resync_interval: 0.1s is too short (at least 1s)"]


def test_gid_repin_choices_and_poll_floor() -> None:
    assert problems({"gid_repin": "sometimes", "gid_repin_poll": "10ms"}) == [
        "gid_repin: Input should be 'auto' or 'never' (got 'sometimes')",
        "gid_repin_poll: 0.01s is too short (at least 100ms)"]


def test_load_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "absent.yaml")
    assert info.value.problems == [f"{tmp_path / 'absent.yaml'}: config file not found"]

    bad = tmp_path / "bad.yaml"
    bad.write_text("rails:\n  - name: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(f"{bad}: line 3: invalid YAML")

    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("rails:\n  - {name: a, interface: e0, address: 1.2.3.4/33}\n")
    with pytest.raises(ConfigError) as info:
        load_config(wrong)
    assert info.value.problems == [
        f"{wrong}: rails[0].address: '1.2.3.4/33' is not an IPv4 interface address"]


def test_cli_invalid_config_exits_2_with_one_line_per_problem(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rails:\n  - {name: a, interface: e0, address: x}\n  - {name: a, extra: 1}\n")
    for verb in (["check"], ["check", "--config-only"], ["apply"], ["apply", "--dry-run"],
                 ["status"], ["run"]):
        res = subprocess.run([sys.executable, "-m", "nodeagent", *verb, "--config", str(cfg)],
                             capture_output=True, text=True)
        assert res.returncode == 2, (verb, res.stderr)
        assert res.stdout == ""
        assert res.stderr.splitlines() == [
            f"nodeagent: invalid config: {cfg}: rails[0].address: 'x' has no prefix length "
            "(e.g. 10.10.0.5/24)",
            f"nodeagent: invalid config: {cfg}: rails[1].interface: required key is missing",
            f"nodeagent: invalid config: {cfg}: rails[1].address: required key is missing",
            f"nodeagent: invalid config: {cfg}: rails[1].extra: unknown key",
        ]


def test_check_config_only_validates_without_probing(tmp_path: Path) -> None:
    """Rails that exist nowhere: a full check would fail (exit 1); --config-only looks at the
    file alone, so the Ansible role can validate a config before the host is ready for it."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rails:\n  - {name: a, interface: nosuch0, address: 10.9.0.1/24}\n")
    res = subprocess.run([sys.executable, "-m", "nodeagent", "check", "--config-only",
                          "--json", "--config", str(cfg)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"config": str(cfg), "valid": True}


def test_config_path_from_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "env.yaml"
    cfg.write_text("bogus: 1\n")
    res = subprocess.run([sys.executable, "-m", "nodeagent", "check"], capture_output=True,
                         text=True, env={"NODEAGENT_CONFIG": str(cfg), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 2
    assert res.stderr.strip() == f"nodeagent: invalid config: {cfg}: bogus: unknown key"


def test_bad_usage_exits_2() -> None:
    res = subprocess.run([sys.executable, "-m", "nodeagent", "frobnicate"], capture_output=True,
                         text=True)
    assert res.returncode == 2


def test_rails_are_managed_unless_said_otherwise() -> None:
    rails = [{"name": "a", "interface": "r0", "address": "10.0.0.1/24"},
             {"name": "b", "interface": "r1", "address": "10.0.1.1/24", "manage": False},
             {"name": "c", "interface": "r2", "address": "10.0.2.1/24", "manage": True}]
    cfg = parse_config({"rails": rails})
    assert [cfg.manages(r) for r in cfg.rails] == [True, False, True]
    cfg = parse_config({"rails": rails, "manage_rails": False})
    assert [cfg.manages(r) for r in cfg.rails] == [False, False, True]
    assert problems({"manage_rails": "sometimes"}) == [
        "manage_rails: Input should be a valid boolean, unable to interpret input "
        "(got 'sometimes')"]



@pytest.mark.parametrize(("patch", "expected"), [
    ({"state_dir": "/etc"}, "state_dir: '/etc' is a system directory, not one of the "
                            "agent's own (e.g. /var/lib/nodeagent)"),
    ({"runtime_dir": "/"}, "runtime_dir: '/' is a system directory, not one of the agent's "
                           "own (e.g. /var/lib/nodeagent)"),
    ({"state_dir": "/proc/self"}, "state_dir: '/proc/self' is a system directory, not one of "
                                  "the agent's own (e.g. /var/lib/nodeagent)"),
    ({"paths": {"lfs": "lfs -x"}}, "paths.lfs: 'lfs -x' is a command line: give the program "
                                   "alone"),
    ({"custom_checks": {"checks": [{"name": "c", "command": [" "]}]}},
     "custom_checks.checks[0].command: ' ' is neither a command name nor an absolute path"),
    ({"custom_checks": {"checks": [{"name": "c", "command": ["-rf"]}]}},
     "custom_checks.checks[0].command: '-rf' starts with '-': an option, not a program"),
    ({"lustre": [{"mountpoint": "/", "source": "10.0.0.1@o2ib:/scratch"}]},
     "lustre[0].mountpoint: '/' is the root filesystem, not a Lustre mount"),
    ({"lustre": [{"mountpoint": "/lustre\n/scratch", "source": "10.0.0.1@o2ib:/scratch"}]},
     "lustre[0].mountpoint: '/lustre\\n/scratch' holds a control character (a newline?)"),
])
def test_paths_and_commands_that_are_not_the_agents_own(patch: dict[str, Any],
                                                          expected: str) -> None:
    assert problems(patch) == [expected]


def test_directories_are_made_without_the_umask(tmp_path: Path) -> None:
    """Under umask 000 the state and runtime directories (and the parents made for them)
    were 0777; now each is 0755 whatever the umask."""
    import os
    import stat

    from nodeagent.io.files import write_json_atomic
    from nodeagent.publish.status import DaemonLock

    old = os.umask(0)
    try:
        write_json_atomic(tmp_path / "state" / "deep" / "pins.json", {})
        lock = DaemonLock(tmp_path / "run")
        lock.acquire()
        assert lock.fd is not None
        os.close(lock.fd)
    finally:
        os.umask(old)
    for made in ("state", "state/deep", "run"):
        mode = stat.S_IMODE((tmp_path / made).stat().st_mode)
        assert mode == 0o755, (made, oct(mode))


@pytest.mark.parametrize(("metrics", "expected"), [
    ({"listen": "0.0.0.0:9464"},
     "metrics: listen 0.0.0.0:9464 is reachable from other hosts: set metrics.expose: true "
     "to mean it"),
    ({"listen": "metrics.example:9464"},
     "metrics.listen: 'metrics.example:9464': 'metrics.example' is not an IP address or "
     "localhost"),
    ({"listen": "127.0.0.1:\u0669\u0664\u0666\u0664"},  # Arabic-Indic digits
     "metrics.listen: '127.0.0.1:\u0669\u0664\u0666\u0664' is not host:port (e.g. "
     "127.0.0.1:9464)"),
])
def test_metrics_listen_stays_on_this_host_unless_exposed(metrics: dict[str, Any],
                                                          expected: str) -> None:
    assert problems({"metrics": metrics}) == [expected]
    assert parse_config({"metrics": {"listen": "0.0.0.0:9464", "expose": True}}).metrics


@pytest.mark.parametrize(("text", "expected"), [
    # YAML 1.1 reads these as 1500 and 64: refused rather than taken as another number.
    ("rails:\n  - {name: a, interface: e0, address: 10.1.0.5/24, mtu: 25:00}\n",
     "line 2: '25:00' is a base-60 number in YAML 1.1, not what it looks like: quote it, "
     "or write the number in decimal"),
    ("rails:\n  - {name: a, interface: e0, address: 10.1.0.5/24, table: 0100}\n",
     "line 2: '0100' is an octal number in YAML 1.1, not what it looks like: quote it, or "
     "write the number in decimal"),
    ("resync_interval: \u0663\u0660s\n",  # Arabic-Indic digits: float() takes them
     "resync_interval: '\u0663\u0660s' is not a duration (use e.g. 30s, 500ms, 2m, 1h30m, 1d)"),
])
def test_numbers_that_read_as_other_numbers_are_refused(tmp_path: Path, text: str,
                                                        expected: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"{path}: {expected}"]
    assert load_config(_written(tmp_path, "resync_interval: 30s\n")).resync_interval == 30.0


def _written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ok.yaml"
    path.write_text(text)
    return path
