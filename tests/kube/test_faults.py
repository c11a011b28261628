"""Faults around the API server: it dies and comes back; a plugin that would deadlock."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kubernetes import client as k8s
from test_publisher import BOOT, KEY, kcfg, our_taint, report

from nodeagent.checks.deviceplugin import device_plugin_finding
from nodeagent.checks.fabric import fabric_finding
from nodeagent.config import parse_config
from nodeagent.model.status import Report, Status
from nodeagent.probes.kube import KubeReader, WatchingReader
from nodeagent.publish.kube import NodeWriter
from nodeagent.publish.publisher import Publisher
from tests.kit.apiserver import ApiServer, build_testenv, node_json
from tests.kit.helpers import wait_for


def test_api_server_down_then_back_catches_up_with_the_newest_state(
    own_apiserver: ApiServer,
) -> None:
    core = k8s.CoreV1Api(own_apiserver.client("admin"))
    core.create_node({"metadata": {"name": "node-a"},  # type: ignore[arg-type]
                      "spec": {"taints": [BOOT]}})
    conf = kcfg(clear_after=0.2)
    pub = Publisher(conf, lambda: NodeWriter(own_apiserver.client("agent-node-a"), "node-a",
                                             conf))
    pub.start()
    try:
        pub.submit(report("node-a"))
        wait_for(lambda: our_taint(core, "node-a") is None, what="healthy at first")
        own_apiserver.stop()
        pub.submit(report("node-a", failing="NoCarrier"))
        wait_for(lambda: pub.state.last_error is not None, what="the writer noticing")
        pub.submit(report("node-a", failing="RuleMissing"))  # newer than what failed
        own_apiserver.start(build_testenv())
        wait_for(lambda: (our_taint(core, "node-a") or {}).get("value") == "RuleMissing",
                 timeout=60, what="the newest state written once the API is back")
        # The taint is written first, the conditions in the next request.
        wait_for(lambda: next(((c["status"], c["reason"]) for c in node_json(core, "node-a")
                               ["status"].get("conditions") or [] if c["type"] == "FabricReady"),
                              None) == ("False", "RuleMissing"),
                 what="FabricReady=False (RuleMissing) on the Node")
        wait_for(lambda: pub.state.synced, what="synced again")
    finally:
        pub.stop()


def test_plugin_that_does_not_tolerate_the_taint_is_reported(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
) -> None:
    """Tainting would keep such a plugin off the node forever: the condition says so, and
    its transition is a Warning Event."""
    apps = k8s.AppsV1Api(apiserver.client("admin"))
    labels = {"app": "rdma-dp-intolerant"}
    apps.create_namespaced_daemon_set("kube-system", {  # type: ignore[arg-type]
        "metadata": {"name": "rdma-dp-intolerant"},
        "spec": {"selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "dp", "image": "registry.example/rdma-dp:1"}]}}}})
    node = fresh_node("node-b", [BOOT])
    cfg = parse_config({"node_name": node, "kubernetes": {},
                        "device_plugin": {"daemonset": "rdma-dp-intolerant"}})
    assert cfg.device_plugin is not None
    obs = KubeReader(apiserver.client("agent-node-b"), node).device_plugin(cfg.device_plugin)
    plugin = device_plugin_finding(cfg, obs)
    assert plugin.reason == "PluginDoesNotTolerateFabricTaint"
    findings = [plugin if f.type == plugin.type else f for f in report(node).findings]
    findings[-1] = fabric_finding(findings[:-1])
    conf = kcfg()
    pub = Publisher(conf, lambda: NodeWriter(apiserver.client("agent-node-b"), node, conf))
    pub.start()
    try:
        pub.submit(Status(Report(node=node, findings=findings)))

        def message() -> str:
            conds = node_json(core, node).get("status", {}).get("conditions") or []
            return next((c["message"] for c in conds if c["type"] == "RDMADevicePluginReady"),
                        "")

        wait_for(lambda: "does not tolerate the fabric taint" in message(), what="in condition")
        assert KEY in message()
        def warned() -> bool:
            events = core.list_namespaced_event(
                "default", field_selector=f"involvedObject.name={node}").items
            return any(e.reason == "RDMADevicePluginReadyFailed" and e.type == "Warning"
                       and "PluginDoesNotTolerateFabricTaint" in e.message for e in events)

        wait_for(warned, what="a Warning Event")
        wait_for(lambda: (our_taint(core, node) or {}).get("value")
                 == "PluginDoesNotTolerateFabricTaint", what="the taint names the reason")
    finally:
        pub.stop()


def test_watching_reader_across_an_api_server_restart(own_apiserver: ApiServer) -> None:
    """Down: the plugin's facts become Unknown (not a false alarm). Back: the watches resume
    (or list again) and the newest state is seen."""
    core = k8s.CoreV1Api(own_apiserver.client("admin"))
    core.create_node({"metadata": {"name": "node-a"}})  # type: ignore[arg-type]
    cfg = parse_config({"node_name": "node-a", "kubernetes": {},
                        "device_plugin": {"daemonset": "dp", "resource": "rdma/hca"}})
    dp = cfg.device_plugin
    assert dp is not None
    reader = WatchingReader(own_apiserver.client("agent-node-a"), "node-a", dp, lambda: None)
    try:
        assert device_plugin_finding(cfg, reader.device_plugin(dp)).reason == "DaemonSetMissing"
        own_apiserver.stop()
        wait_for(lambda: device_plugin_finding(cfg, reader.device_plugin(dp)).reason
                 == "APIUnreachable", timeout=30, what="Unknown while the API is down")
        own_apiserver.start(build_testenv())
        core.patch_node_status("node-a", {"status": {"capacity": {"rdma/hca": "2"},
                                                     "allocatable": {"rdma/hca": "2"}}},
                               _content_type="application/merge-patch+json")
        wait_for(lambda: (node := reader.device_plugin(dp).node) is not None
                 and node.allocatable.get("rdma/hca") == "2", timeout=60,
                 what="the node's newest state after the restart")
        assert device_plugin_finding(cfg, reader.device_plugin(dp)).reason == "DaemonSetMissing"
    finally:
        reader.stop()


def test_every_api_failure_says_what_failed_in_one_line(
    apiserver: ApiServer, tmp_path: Path,
) -> None:
    """A wrong CA was reported as '(0)', the client library's text for an ApiException of
    status 0: now the TLS failure and the server. Refused connections and refusals by RBAC
    say theirs too (through the publisher's status and the device plugin's Unknown)."""
    from nodeagent.kube.api import Counters, call
    from nodeagent.publish.publisher import describe_error
    from tests.kit.helpers import free_port
    from tests.kit.pki import make_ca, pem_cert

    other_ca = tmp_path / "other-ca.crt"
    other_ca.write_bytes(pem_cert(make_ca("not-the-cluster-ca")[0]))
    conf = apiserver.configuration("agent-node-a")
    conf.ssl_ca_cert = str(other_ca)
    port = apiserver.url.rsplit(":", 1)[1]

    def failure(client: k8s.ApiClient, path: str = "/api/v1/nodes/node-a") -> str:
        try:
            call(client, Counters(), "GET", path)
        except Exception as exc:
            return describe_error(exc)
        raise AssertionError("the request succeeded")

    wrong_ca = failure(k8s.ApiClient(conf))
    assert wrong_ca.startswith("TLS: certificate verify failed"), wrong_ca
    assert wrong_ca.endswith(f"(127.0.0.1:{port})") and "\n" not in wrong_ca, wrong_ca

    nobody = apiserver.configuration("agent-node-a")
    nobody.host = f"https://127.0.0.1:{free_port()}"
    refused = failure(k8s.ApiClient(nobody))
    assert "Connection refused" in refused and "(127.0.0.1:" in refused, refused

    forbidden = failure(apiserver.client("stranger"))
    assert forbidden.startswith("HTTP 403: ") and "forbidden" in forbidden, forbidden
