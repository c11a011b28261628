"""Hostile config files: whatever the text, the loader ends in a Config or in ConfigError
with one short line per problem, quickly, and never with a traceback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.config import ConfigError, load_config

RAIL = {"name": "rail0", "interface": "ens1f0", "address": "10.10.0.5/24"}


def load_problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return [p.removeprefix(f"{path}: ") for p in info.value.problems]


def test_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    # 9 levels of 9 aliases: 387 million values once expanded, a few hundred bytes of text.
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    started = time.monotonic()
    got = load_problems(tmp_path, "\n".join(lines) + "\n")
    assert got == ["invalid YAML: more than 50000 values once aliases are expanded"]
    assert time.monotonic() - started < 5  # a hang guard, not a performance figure


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    assert load_problems(tmp_path, "rails: &r [*r]\n") != []


def test_deep_nesting_is_one_line(tmp_path: Path) -> None:
    got = load_problems(tmp_path, "a: " + "[" * 5000 + "]" * 5000 + "\n")
    assert got == ["line 1: invalid YAML: nested deeper than 32 levels"]


def test_huge_integer_is_one_line(tmp_path: Path) -> None:
    got = load_problems(tmp_path, "resync_interval: " + "9" * 4000 + "\n")
    assert got == ["line 1: integer with more than 24 digits"]


def test_duplicate_keys_are_errors(tmp_path: Path) -> None:
    text = yaml.safe_dump({"rails": [RAIL]}) + "rails: []\n"
    got = load_problems(tmp_path, text)
    assert len(got) == 1 and "duplicate key 'rails'" in got[0]
    nested = "kubernetes:\n  cordon: true\n  cordon: false\n"
    assert "duplicate key 'cordon'" in load_problems(tmp_path, nested)[0]


def test_merge_keys_still_work(tmp_path: Path) -> None:
    text = ("base: &base {interface: ens1f0, address: 10.10.0.5/24}\n"
            "rails:\n  - <<: *base\n    name: rail0\n")
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:  # 'base' is not a key, but the merge parsed
        load_config(path)
    assert info.value.problems == [f"{path}: base: unknown key"]


@pytest.mark.parametrize("value, expected", [
    (".nan", "resync_interval: NaN is not a duration"),
    (".inf", "resync_interval: inf is longer than a week (604800s)"),
    ("1.0e+11", "resync_interval: 100000000000.0 is longer than a week (604800s)"),
    ("'8d'", "resync_interval: '8d' is longer than a week (604800s)"),
    ("'8x'", "resync_interval: '8x' is not a duration (use e.g. 30s, 500ms, 2m, 1h30m, 1d)"),
    ("200h", "resync_interval: '200h' is longer than a week (604800s)"),
])
def test_durations_are_finite_and_bounded(tmp_path: Path, value: str, expected: str) -> None:
    assert load_problems(tmp_path, f"resync_interval: {value}\n") == [expected]


@pytest.mark.parametrize("key", ["lustre_interval", "gid_repin_poll"])
def test_loop_intervals_cannot_spin(tmp_path: Path, key: str) -> None:
    assert load_problems(tmp_path, f"{key}: 0\n") == [f"{key}: 0s is too short (at least 100ms)"]


@pytest.mark.parametrize("name, why", [
    ("..", "reserved by the kernel"), (".", "reserved by the kernel"),
    ("a\u0000b", "'/', ':', whitespace or a control character"),
    ("a b", "'/', ':', whitespace or a control character"),
    ("eth0:1", "'/', ':', whitespace or a control character"),
    ("ééééééééé", "longer than 15 bytes"),  # 9 characters, 18 bytes
])
def test_interface_names_follow_the_kernel(name: str, why: str) -> None:
    from nodeagent.config import parse_config

    with pytest.raises(ConfigError) as info:
        parse_config({"rails": [{**RAIL, "interface": name}]})
    assert info.value.problems == [
        f"rails[0].interface: {name!r} is not a valid interface name ({why})"]


@pytest.mark.parametrize("patch, expected", [
    ({"state_dir": ""}, "state_dir: is empty (an absolute path is required)"),
    ({"runtime_dir": "run"}, "runtime_dir: 'run' is not an absolute path"),
    ({"paths": {"sysfs": "sys"}}, "paths.sysfs: 'sys' is not an absolute path"),
    ({"paths": {"rdma": "bin/rdma"}},
     "paths.rdma: 'bin/rdma' is neither a command name nor an absolute path"),
    ({"lustre": [{"mountpoint": "/l", "source": "s", "remount_command": []}]},
     "lustre[0].remount_command: List should have at least 1 item after validation, not 0 "
     "(got [])"),
    ({"node_name": "Node_A"}, "node_name: 'Node_A' is not a Node name (a lowercase DNS-1123 "
     "subdomain)"),
    ({"kubernetes": {"taint": {"key": "bad key/x"}}},
     "kubernetes.taint.key: 'bad key/x' is not a qualified name (e.g. example.com/fabric)"),
    ({"kubernetes": {"event_rate": float("nan")}},
     "kubernetes.event_rate: Input should be a finite number (got nan)"),
    ({"rails": [{**RAIL, "gid_index": 10**9}]},
     "rails[0].gid_index: Input should be less than or equal to 65535 (got 1000000000)"),
])
def test_values_out_of_their_range(patch: dict[str, Any], expected: str) -> None:
    from nodeagent.config import parse_config

    with pytest.raises(ConfigError) as info:
        parse_config(patch)
    assert info.value.problems == [expected]


def test_field_and_cross_field_problems_in_one_run() -> None:
    from nodeagent.config import parse_config

    with pytest.raises(ConfigError) as info:
        parse_config({"resync_interval": "soon", "rails": [
            {**RAIL, "rule_priority": 5},
            {**RAIL, "name": "rail1", "interface": "ens1f1"}]})
    assert info.value.problems == [
        "resync_interval: 'soon' is not a duration (use e.g. 30s, 500ms, 2m, 1h30m, 1d)",
        "rails[0].rule_priority: set without rails[0].table",
        "rails[1].address: '10.10.0.5' duplicates rails[0].address",
    ]


def test_long_values_are_cut_in_the_error_line() -> None:
    from nodeagent.config import parse_config

    with pytest.raises(ConfigError) as info:
        parse_config({"rails": [{**RAIL, "address": "x" * 100_000}]})
    assert len(info.value.problems) == 1 and len(info.value.problems[0]) < 200


def test_config_that_is_not_a_file(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError) as info:
        load_config(fifo)  # opening a FIFO for reading would block until a writer comes
    assert info.value.problems == [f"{fifo}: cannot read config: a FIFO, not a regular file"]
    big = tmp_path / "big.yaml"
    big.write_text("#" * (2 << 20))
    with pytest.raises(ConfigError) as info:
        load_config(big)
    assert info.value.problems == [f"{big}: cannot read config: larger than 1048576 bytes"]
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"rails: \xff\xfe\n")
    with pytest.raises(ConfigError) as info:
        load_config(binary)
    assert info.value.problems == [f"{binary}: cannot read config: not utf-8 text (byte 7)"]


# ---------------------------------------------------------------- generated configs

_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(["30s", "500ms", "-1s", "1e400", "..", "/", "", "eth0", "10.0.0.1/24",
                     "10.0.0.300/24", "NoSchedule", ".nan", "auto", "ffff::1"]))
_keys = st.sampled_from([
    "node_name", "paths", "sysfs", "procfs", "state_dir", "runtime_dir", "resync_interval",
    "rails", "name", "interface", "address", "mtu", "table", "rule_priority", "gateway",
    "gid_index", "rdma_device", "rdma_port", "exclusive", "sysctls", "rail_sysctls",
    "arp_ignore", "gid_source", "gid_repin", "gid_repin_poll", "link_flap", "window",
    "max_flaps", "dwell", "repair_guard", "lustre", "mountpoint", "source", "timeout",
    "remount_command", "kubernetes", "taint", "key", "effect", "clear_after", "metrics",
    "listen", "device_plugin", "registry", "fabric_traffic", "unknown"])
_values = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(_keys, inner, max_size=6)),
    max_leaves=30)
_rail = st.fixed_dictionaries(
    {"name": st.sampled_from(["rail0", "rail1", "", "r 0"]),
     "interface": st.sampled_from(["ens1f0", "ens1f1", "..", "x" * 16, "a/b"]),
     "address": st.sampled_from(["10.10.0.5/24", "10.10.0.5", "10.11.0.5/24", "::1/64"])},
    optional={"table": st.integers(-5, 300), "rule_priority": st.integers(-1, 2**33),
              "gateway": st.sampled_from(["10.10.0.1", "10.10.0.5", "10.99.0.1", "x"]),
              "gid_index": st.integers(-10, 70000), "mtu": st.integers(0, 70000)})
_config = st.one_of(
    _values,
    st.fixed_dictionaries({}, optional={
        "rails": st.lists(_rail, max_size=3), "resync_interval": _scalar,
        "lustre": st.lists(st.dictionaries(_keys, _values, max_size=4), max_size=2),
        "kubernetes": st.dictionaries(_keys, _values, max_size=4),
        "state_dir": _scalar, "node_name": _scalar}))


def _check_outcome(path: Path) -> None:
    try:
        load_config(path)
    except ConfigError as exc:
        assert exc.problems, "ConfigError without a problem"
        for line in exc.problems:
            assert "\n" not in line and len(line) < 400, line


@given(_config)
def test_generated_configs_load_or_fail_in_one_line(tmp_path_factory: Any, data: Any) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    _check_outcome(path)


@given(st.text(max_size=400))
def test_generated_text_loads_or_fails_in_one_line(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _check_outcome(path)


@given(st.binary(max_size=200))
def test_generated_bytes_load_or_fail_in_one_line(tmp_path_factory: Any, raw: bytes) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_bytes(raw)
    _check_outcome(path)


def test_cli_exit_codes_on_hostile_files(tmp_path: Path) -> None:
    """The real command: exit 2, one line per problem, no traceback."""
    cases = {
        "bomb": "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"a{i}: &a{i} [{', '.join([f'*a{i - 1}' if i > 1 else '*a'] * 10)}]\n"
            for i in range(1, 8)),
        "deep": "a: " + "[" * 3000 + "]" * 3000 + "\n",
        "int": "rails: [{name: r, interface: e, address: 10.0.0.1/24, mtu: " + "9" * 5000 + "}]\n",
        "dup": "resync_interval: 5s\nresync_interval: 6s\n",
    }
    for name, text in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        for args in (["check", "--config-only"], ["check"], ["run"]):
            proc = subprocess.run([sys.executable, "-m", "nodeagent", *args, "--config",
                                   str(path)], capture_output=True, text=True, timeout=60)
            assert proc.returncode == 2, (name, args, proc.stderr)
            lines = proc.stderr.splitlines()
            assert len(lines) == 1 and "Traceback" not in proc.stderr, (name, proc.stderr)
            assert lines[0].startswith(f"nodeagent: invalid config: {path}: "), lines[0]
