"""The condition contract, generated from the registry: with every registered condition's
section configured, the daemon publishes each one to its Node through the admission policy
as deploy/ renders it, and an operator sees each one where they look: the real `kubectl get
node -o jsonpath` and `kubectl describe node`, `nodeagent fleet -o wide`, the metrics. A
condition registered later is covered here without editing this file (its registry entry
carries the smallest section that turns it on)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from nodeagent.checks.conditions import CONDITION_TYPES, CONDITIONS
from nodeagent.cli.main import main
from nodeagent.model.conditions import FABRIC_READY
from tests.kit.apiserver import ApiServer, build_kubectl, node_json
from tests.kit.helpers import LoopbackBridge, Netns, free_port, stop_daemon, wait_for, write_config


def kubectl(apiserver: ApiServer, kubeconfig: Path, *args: str) -> str:
    out = subprocess.run([str(build_kubectl()), "--kubeconfig", str(kubeconfig), *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
    return out.stdout


def scrape(ns: Netns, port: int) -> str:
    """The metrics, fetched from inside the namespace, where the endpoint listens."""
    code = (f"import urllib.request; print(urllib.request.urlopen("
            f"'http://127.0.0.1:{port}/metrics', timeout=5).read().decode())")
    return ns.exec(sys.executable, "-c", code).stdout


def test_every_registered_condition_reaches_the_node_and_every_view_of_it(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    build_kubectl()  # before the daemon starts: a build is minutes, the daemon's clock runs
    node = fresh_node("node-b")  # one of the identities the test API server knows
    port = free_port()
    sections = {c.section: c.example for c in CONDITIONS if c.section is not None}
    agent_config.update(sections)
    agent_config.update({
        "node_name": node, "resync_interval": "1h",
        "metrics": {"listen": f"127.0.0.1:{port}"},
        "kubernetes": {"kubeconfig": str(apiserver.kubeconfig(f"agent-{node}",
                                                              tmp_path / "agent.kubeconfig")),
                       "lease_period": "2s"}})
    admin = apiserver.kubeconfig("admin", tmp_path / "admin.kubeconfig")
    rails_ns.ip("link", "set", "lo", "up")
    bridge = LoopbackBridge(rails_ns.name, apiserver.port)
    proc = rails_ns.start_daemon(write_config(tmp_path / "c.yaml", agent_config))
    try:
        def missing() -> list[str]:
            on_node = {c["type"] for c in node_json(core, node)["status"].get("conditions") or []}
            return [str(t) for t in CONDITION_TYPES if t not in on_node]

        try:
            wait_for(lambda: not missing(), timeout=60, what="every registered condition")
        except AssertionError:
            raise AssertionError(f"registered, never on the Node: {missing()}") from None

        # kubectl, as an operator reads it: each type with a status, reason and message.
        jsonpath = ("{range .status.conditions[*]}{.type}{'\\t'}{.status}{'\\t'}{.reason}"
                    "{'\\t'}{.message}{'\\n'}{end}")
        rows = {line.split("\t")[0]: line.split("\t")[1:]
                for line in kubectl(apiserver, admin, "get", "node", node,
                                    "-o", f"jsonpath={jsonpath}").splitlines()}
        # describe's Conditions table: type, status, two times, reason, message (each read
        # of the Node is its own: a source's first verdict may land between two of them).
        statuses = {"True", "False", "Unknown"}
        described = {line.split()[0]: line.split()
                     for line in kubectl(apiserver, admin, "describe", "node", node).splitlines()
                     if len(line.split()) > 1 and line.split()[1] in statuses}
        for ctype in CONDITION_TYPES:
            status, reason, message = rows[ctype]
            assert status in statuses and reason and message, (ctype, rows)
            assert len(described.get(ctype, ())) >= 6, f"kubectl describe node: no {ctype} row"

        # The fleet's wide view: a column per condition, each filled from the Node.
        capsys.readouterr()
        assert main(["fleet", "--kubeconfig", str(admin), "-o", "wide"]) in (0, 1)
        head, *lines = capsys.readouterr().out.splitlines()
        assert main(["fleet", "--kubeconfig", str(admin), "-o", "json"]) in (0, 1)
        item = next(i for i in json.loads(capsys.readouterr().out)["items"] if i["node"] == node)
        assert item["fabric"] in statuses
        for c in CONDITIONS:
            if c.type != FABRIC_READY:
                assert c.column in head.split(), c.column
                assert item["conditions"][c.type]["status"] in statuses, c.type
        assert any(line.split()[0] == node for line in lines)

        # The metrics: each registered type's gauge, with exactly one status at 1 (which
        # one may have moved on since kubectl read it: a source's first verdict lands).
        text = scrape(rails_ns, port)
        for ctype in CONDITION_TYPES:
            ones = [s for s in ("True", "False", "Unknown")
                    if f'nodeagent_condition{{condition="{ctype}",status="{s}"}} 1.0' in text]
            assert len(ones) == 1, (ctype, ones)
    finally:
        code, log = stop_daemon(proc)
        bridge.close()
    assert code == 0, log
    assert "is forbidden" not in log and "denied" not in log, log  # the policy let all pass

