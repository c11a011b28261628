"""units/: the service file passes `systemd-analyze verify` and its offline security
assessment stays within the goal; the drop-in example parses."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "units" / "nodeagent.service"
SLICE = ROOT / "units" / "nodeagent.slice"
GOAL = 3.0


def analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.fail("systemd-analyze missing (Debian package systemd)")
    return path


def local_unit(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this checkout's venv: verify checks that the
    executable exists, and /opt/nodeagent is where the Ansible role puts it on a host."""
    text = UNIT.read_text()
    assert "/opt/nodeagent/venv/bin/nodeagent" in text
    venv_bin = Path(sys.executable).parent / "nodeagent"
    path = tmp_path / "nodeagent.service"
    path.write_text(text.replace("/opt/nodeagent/venv/bin/nodeagent", str(venv_bin)))
    (tmp_path / "nodeagent.slice").write_text(SLICE.read_text())  # verify loads it beside
    return path


def test_unit_verifies(tmp_path: Path) -> None:
    res = subprocess.run([analyze(), "verify", str(local_unit(tmp_path))],
                         capture_output=True, text=True)
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr


def test_security_exposure_within_goal(tmp_path: Path) -> None:
    res = subprocess.run([analyze(), "security", "--offline=true", "--no-pager",
                          str(local_unit(tmp_path))], capture_output=True, text=True)
    m = re.search(r"Overall exposure level for nodeagent.service: ([\d.]+)", res.stdout)
    assert m, res.stdout + res.stderr
    assert float(m.group(1)) <= GOAL, res.stdout


def test_unit_contract() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(UNIT)
    service = unit["Service"]
    assert service["Type"] == "notify" and service["WatchdogSec"] == "30s"
    assert service["Restart"] == "always"
    assert service["CapabilityBoundingSet"] == "CAP_NET_ADMIN"
    assert "kubelet.service" in unit["Unit"]["Before"]
    assert "Requires" not in unit["Unit"] and "kubelet" not in unit["Install"].get(
        "RequiredBy", "")


def test_slice_verifies_and_gives_the_agent_a_weight_against_the_pods(tmp_path: Path) -> None:
    """The unit runs in its own top-level slice, weighted far above system.slice's 100 (the
    bench: p50 60-160 ms per repair at 100 against kubepods' 5000, 2.4 ms at 10000) and
    bounded to one core."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read([UNIT, SLICE])
    assert unit["Service"]["Slice"] == SLICE.name
    assert int(unit["Slice"]["CPUWeight"]) == 10000 and unit["Slice"]["CPUQuota"] == "100%"
    path = tmp_path / SLICE.name
    path.write_text(SLICE.read_text())
    res = subprocess.run([analyze(), "verify", str(path)], capture_output=True, text=True)
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr


def test_dropin_example_parses() -> None:
    dropin = configparser.ConfigParser(strict=False, interpolation=None)
    dropin.optionxform = str  # type: ignore[assignment,method-assign]
    dropin.read(ROOT / "units" / "nodeagent.service.d" / "nodeagent.conf")
    assert dropin["Service"]["LoadCredential"] == "kubeconfig:/etc/nodeagent/kubeconfig"
