"""Prometheus alerting rules for what the node itself cannot report: a fleet-wide view from
kube-state-metrics series, and one from the agents' own metrics (why a plugin cannot run).
The incident behind them: a device-plugin DaemonSet never Ready for 271 days, with no alert.
Generated from the agent's config (DaemonSet, resource, taint key, Lease namespace) so the
rules watch exactly what the agents enforce; `deploy/alerts/` holds the output for the
default config.
"""

from __future__ import annotations

import re
from typing import Any

from nodeagent.cli.options import Windows
from nodeagent.config import Config, DevicePlugin, Kubernetes, parse_duration

GROUP = "nodeagent-fabric"
DEFAULT_WINDOWS = Windows()


def ksm_label(name: str) -> str:
    """A resource name as kube-state-metrics writes it in a label value (rdma/x -> rdma_x)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _alert(name: str, expr: str, duration: str, severity: str, summary: str,
           description: str) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": duration, "labels": {"severity": severity},
            "annotations": {"summary": summary, "description": description}}


def alert_groups(cfg: Config, w: Windows = DEFAULT_WINDOWS) -> list[dict[str, Any]]:
    dp = cfg.device_plugin or DevicePlugin()
    kube = cfg.kubernetes or Kubernetes()
    rules = [*_plugin_alerts(dp, w), *_node_alerts(kube, dp, w), _peer_suspect(w),
             _switch_suspect(w)]
    if kube.taint is None:  # conditions only: the taint belongs to a readiness rule
        rules = [r for r in rules if r["alert"] != "FabricTaintStuck"]
    return [{"name": GROUP, "rules": rules}]


def _plugin_alerts(dp: DevicePlugin, w: Windows) -> list[dict[str, Any]]:
    """The device plugin's DaemonSet, from kube-state-metrics and the agents' reasons."""
    ds = f'namespace="{dp.namespace}", daemonset="{dp.daemonset}"'
    on = "on (namespace, daemonset)"
    return [
        _alert(
            "RDMADevicePluginNotReady",
            f"kube_daemonset_status_number_ready{{{ds}}}\n"
            f"  < {on} kube_daemonset_status_desired_number_scheduled{{{ds}}}",
            w.not_ready_for, "warning",
            "RDMA device plugin {{ $labels.namespace }}/{{ $labels.daemonset }} is not Ready "
            "on every node",
            "{{ $value }} pods Ready, fewer than desired, for " + w.not_ready_for + ". Nodes "
            "without it do not advertise the fabric; jobs fall back to TCP.",
        ),
        _alert(
            "RDMADevicePluginNeverReady",
            f"kube_daemonset_status_desired_number_scheduled{{{ds}}} > 0\n"
            f"and {on} max_over_time(kube_daemonset_status_number_ready{{{ds}}}"
            f"[{w.never_ready_window}]) == 0\n"
            f"and {on} kube_daemonset_status_observed_generation{{{ds}}}\n"
            f"  == {on} kube_daemonset_metadata_generation{{{ds}}}\n"
            # Older than the window, or a fresh DaemonSet would count as never Ready.
            f"and {on} time() - kube_daemonset_created{{{ds}}} > "
            f"{int(parse_duration(w.never_ready_window))}",
            w.never_ready_for, "critical",
            "RDMA device plugin {{ $labels.namespace }}/{{ $labels.daemonset }} has not been "
            "Ready anywhere since it rolled out",
            "Not one pod Ready at any moment in the last " + w.never_ready_window + " although "
            "the rollout is observed: the plugin never worked (wrong image platform? "
            "crash loop?). Restart counts and pod age cannot tell this from a recent break.",
        ),
        _alert(
            "RDMADevicePluginCannotRunOnNode",
            # From the agents' own metrics: kube-state-metrics has the DaemonSet's counts,
            # only the node knows why its pod never ran (its runtime's image and logs).
            'nodeagent_condition_reason{condition="RDMADevicePluginReady", '
            'reason=~"ImageArchMismatch|PluginNeverReady|PluginCrashLooping"} == 1',
            w.cannot_run_for, "critical",
            "RDMA device plugin cannot run on {{ $labels.instance }}: {{ $labels.reason }}",
            "The agent there has said so for " + w.cannot_run_for + "; `kubectl describe "
            "node` shows the RDMADevicePluginReady message (the image, its platform and the "
            "node's, or the crash).",
        ),
    ]


def _node_alerts(kube: Kubernetes, dp: DevicePlugin, w: Windows) -> list[dict[str, Any]]:
    """The fabric nodes: a taint that stays, an agent gone quiet, no RDMA resource."""
    stale_after = w.lease_stale_after or int(kube.lease_seconds())
    return [
        _alert(
            "FabricTaintStuck",
            f'kube_node_spec_taint{{key="{kube.taint.key if kube.taint else ""}"}} == 1',
            w.taint_for, "warning",
            "Node {{ $labels.node }} has carried the fabric taint for " + w.taint_for,
            "nodeagent keeps the taint while a fabric condition fails: `kubectl describe "
            "node {{ $labels.node }}` shows which, with its reason.",
        ),
        _alert(
            "NodeAgentLeaseStale",
            f'time() - kube_lease_renew_time{{namespace="{kube.lease_namespace}", '
            f'lease=~"nodeagent-.+"}} > {stale_after}',
            w.lease_stale_for, "warning",
            "nodeagent heartbeat {{ $labels.lease }} is stale",
            "The agent's Lease has not been renewed for more than "
            f"{stale_after} s: its Node conditions may be out of date.",
        ),
        _alert(
            "FabricNodeWithoutRDMAResource",
            # A fabric node is one whose agent publishes FabricReady.
            'max by (node) (kube_node_status_condition{condition="FabricReady"})\n'
            f'unless on (node) kube_node_status_allocatable{{resource="{ksm_label(dp.resource)}"}}'
            " > 0",
            w.no_resource_for, "critical",
            "Fabric node {{ $labels.node }} advertises no " + dp.resource,
            "Zero or absent allocatable " + dp.resource + ": the device plugin is not "
            "registered there, and jobs on this node cannot request the fabric.",
        ),
    ]


def rules_file(groups: list[dict[str, Any]]) -> dict[str, Any]:
    return {"groups": groups}


def prometheus_rule(groups: list[dict[str, Any]], namespace: str) -> dict[str, Any]:
    """The same groups as a prometheus-operator PrometheusRule."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "nodeagent", "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "nodeagent"}},
            "spec": {"groups": groups}}


# The rail as a whole mostly passes: a fault of one place, not the fabric's.
_RAIL_PASSES = ("on (rail) (sum by (rail) (nodeagent_rdma_peer_reachable)\n"
                "  / count by (rail) (nodeagent_rdma_peer_reachable)) >= 0.5")
# Each peer verdict with the prober's switch on that rail (its LLDP info metric).
_BY_SWITCH = "* on (instance, rail) group_left (switch) nodeagent_rail_switch_info"
# The switches most of whose nodes (two at least) each fail most of their probes on a rail
# (one bad node under a switch of two is not most of them).
_SWITCHES_FAILING = (
    "(count by (rail, switch) ((sum by (instance, rail) (1 - nodeagent_rdma_peer_reachable)\n"
    "  / count by (instance, rail) (nodeagent_rdma_peer_reachable) > 0.5)\n"
    f"  {_BY_SWITCH})\n"
    "  / count by (rail, switch) (nodeagent_rail_switch_info)) > 0.5\n"
    "and on (rail, switch) count by (rail, switch) (nodeagent_rail_switch_info) >= 2\n"
    f"and {_RAIL_PASSES}")


def _peer_suspect(w: Windows) -> dict[str, Any]:
    """Pingmesh's localisation, from the agents' peer metrics: `node` is the probed node,
    `instance` the prober. More than half of a node's probers (two at least) fail to reach
    it over RoCE, while the rail as a whole mostly passes, and the node's switch on the
    rail is not failing (RDMASwitchSuspect names it instead)."""
    return _alert(
        "RDMAPeerSuspect",
        "(count by (rail, node) (nodeagent_rdma_peer_reachable == 0)\n"
        "  / count by (rail, node) (nodeagent_rdma_peer_reachable)) > 0.5\n"
        "and on (rail, node) count by (rail, node) (nodeagent_rdma_peer_reachable) >= 2\n"
        f"and {_RAIL_PASSES}\n"
        "unless on (rail, node) (nodeagent_rail_switch_info * on (rail, switch) group_left ()\n"
        f"  ({_SWITCHES_FAILING}))",
        w.peer_suspect_for, "warning",
        "Node {{ $labels.node }} is unreachable over RoCE on {{ $labels.rail }} from most "
        "of its peers",
        "{{ $value | humanizePercentage }} of the nodes that probe it fail over RoCE, "
        "while the rail passes elsewhere: its link, switch port or VLAN is the suspect.",
    )


def _switch_suspect(w: Windows) -> dict[str, Any]:
    """R-Pingmesh's ToR localisation, from the peer metrics joined with each prober's
    switch (nodeagent_rail_switch_info, with an lldp section): the nodes under a switch
    fail most of their probes on a rail while the rail as a whole passes. Named once, for
    the switch; its nodes are not RDMAPeerSuspect for it."""
    return _alert(
        "RDMASwitchSuspect", _SWITCHES_FAILING, w.switch_suspect_for, "warning",
        "Switch {{ $labels.switch }}: its nodes fail most of their RoCE probes on "
        "{{ $labels.rail }}",
        "{{ $value | humanizePercentage }} of the nodes under it fail most of their probes "
        "over RoCE while the rail passes elsewhere: the switch or its uplinks are the "
        "suspect, not each node under it.",
    )
