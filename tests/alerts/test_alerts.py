"""The alert rules in deploy/alerts: generated from the default config, valid, and proven by
promtool on series that model the incident (they fire) and a healthy fleet (they do not)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from nodeagent.cli.alerts import Windows, alert_groups, ksm_label, prometheus_rule, rules_file
from nodeagent.cli.main import main
from nodeagent.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "alerts"
HERE = Path(__file__).parent


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool missing: tools/bootstrap installs Debian's prometheus package")
    return path


@pytest.mark.parametrize("name, args", [
    ("nodeagent-rules.yaml", ["alerts"]),
    ("prometheusrule.yaml", ["alerts", "--format", "prometheusrule"]),
])
def test_committed_rules_are_the_generated_ones(name: str, args: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 0
    assert capsys.readouterr().out == (ALERTS / name).read_text(), \
        f"deploy/alerts/{name} is stale: regenerate it with `nodeagent {' '.join(args)}`"


def test_prometheusrule_carries_the_same_groups() -> None:
    plain = yaml.safe_load((ALERTS / "nodeagent-rules.yaml").read_text())
    crd = yaml.safe_load((ALERTS / "prometheusrule.yaml").read_text())
    assert crd["kind"] == "PrometheusRule" and crd["spec"]["groups"] == plain["groups"]


def test_promtool_accepts_the_rules() -> None:
    res = subprocess.run([promtool(), "check", "rules", str(ALERTS / "nodeagent-rules.yaml")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 8 rules found" in res.stdout


def test_promtool_rule_tests() -> None:
    res = subprocess.run([promtool(), "test", "rules", "rules_test.yaml"], cwd=HERE,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_rules_follow_the_config(tmp_path: Path) -> None:
    cfg = parse_config({"kubernetes": {"taint": {"key": "example.com/fabric"},
                                       "lease_namespace": "agents"},
                        "device_plugin": {"namespace": "rdma", "daemonset": "dp",
                                          "resource": "nvidia.com/hca_shared"}})
    groups = alert_groups(cfg, Windows(taint_for="1h"))
    text = "\n".join(r["expr"] for r in rules_file(groups)["groups"][0]["rules"])
    assert 'namespace="rdma", daemonset="dp"' in text
    assert 'key="example.com/fabric"' in text and 'namespace="agents"' in text
    assert f'resource="{ksm_label("nvidia.com/hca_shared")}"' in text
    assert ksm_label("nvidia.com/hca_shared") == "nvidia_com_hca_shared"
    taint = next(r for r in groups[0]["rules"] if r["alert"] == "FabricTaintStuck")
    assert taint["for"] == "1h"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(prometheus_rule(groups, "mon")["spec"]))
    res = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
