"""Command line: check, apply, run, status, alerts, fleet, preflight.

Exit codes (public contract): 0 every condition True, 1 any False/Unknown, 2 bad usage or
invalid config.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from nodeagent import __version__
from nodeagent.cli.options import Windows, fleet_arguments, preflight_arguments
from nodeagent.config import (
    DEFAULT_CONFIG_PATH,
    Config,
    ConfigError,
    default_config_path,
    load_config,
    parse_config,
)
from nodeagent.io.files import describe_error, printable
from nodeagent.io.lean_imports import iproute_without_ssl
from nodeagent.publish.status import ConditionLine, StatusDocument

EXIT_OK, EXIT_NOT_OK, EXIT_USAGE = 0, 1, 2

log = logging.getLogger("nodeagent")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nodeagent",
        description="Enforce and prove RoCE/RDMA fabric health on this node.",
    )
    p.add_argument("--version", action="version", version=f"nodeagent {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(sp: argparse.ArgumentParser, json_flag: bool = True) -> None:
        sp.add_argument(
            "--config",
            metavar="FILE",
            default=None,
            help=f"config file (default: $NODEAGENT_CONFIG, else {DEFAULT_CONFIG_PATH})",
        )
        if json_flag:
            sp.add_argument("--json", action="store_true", help="machine-readable output")

    cp = sub.add_parser("check", help="evaluate everything once, change nothing")
    common(cp)
    cp.add_argument("--config-only", action="store_true",
                    help="only validate the config file: exit 0 valid, 2 invalid (probes "
                    "nothing; what the Ansible role runs before putting a config in place)")
    ap = sub.add_parser("apply", help="repair local drift once (network, sysctls), then check")
    common(ap)
    ap.add_argument("--dry-run", action="store_true", help="print the repairs, change nothing")
    rp = sub.add_parser("run", help="the daemon: event-driven repair and status")
    common(rp, json_flag=False)
    rp.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    common(sub.add_parser("status", help="what the running daemon last saw"))
    alp = sub.add_parser("alerts", help="print Prometheus alert rules for this config "
                         "(kube-state-metrics series)")
    common(alp, json_flag=False)
    alp.add_argument("--format", choices=["rules", "prometheusrule"], default="rules",
                     help="a plain rules file, or a prometheus-operator PrometheusRule")
    alp.add_argument("--namespace", default="nodeagent-system",
                     help="namespace of the PrometheusRule")
    dp = sub.add_parser("deploy", help="the cluster-side manifests (namespace, RBAC, admission "
                        "policy) rendered for this config's taint key and Lease namespace")
    common(dp, json_flag=False)
    dp.add_argument("--output-dir", metavar="DIR", default=None,
                    help="write one file per manifest here (default: all to stdout)")
    fl = sub.add_parser("fleet", help="every fabric node's conditions, taint, heartbeat and "
                        "RDMA capacity in one table (also: kubectl fabric)")
    fleet_arguments(fl)
    pf = sub.add_parser("preflight", help="in a training pod's init container: exit 1, with "
                        "the reasons, unless its traffic would use the fabric")
    preflight_arguments(pf)
    for field_name, default in vars(Windows()).items():
        alp.add_argument(f"--{field_name.replace('_', '-')}", default=default,
                         type=type(default), metavar="DURATION")
    return p


def _load(path: str | None) -> Config:
    return load_config(path or default_config_path())


MAX_LISTED = 50  # problems printed per condition: a forged status file cannot flood a tty
MAX_FIELD = 1000  # characters printed per problem


def listed(condition: ConditionLine) -> tuple[list[str], int]:
    """A condition's problems, the first MAX_LISTED each cut to MAX_FIELD, and how many
    more there are."""
    shown = list(condition.problems[:MAX_LISTED])
    return ([x if len(x) <= MAX_FIELD else x[:MAX_FIELD] + "..." for x in shown],
            len(condition.problems) - len(shown))


def _print_json(data: dict[str, Any]) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _print_report(doc: StatusDocument, dry_run: bool = False) -> None:
    # What a daemon, a file or a driver wrote: control characters never reach the terminal,
    # and no field floods it.
    def p(text: Any) -> str:
        return printable(str(text)[:MAX_FIELD])

    verdict = "fabric ready" if doc.ok else "FABRIC NOT READY"
    print(f"node {p(doc.node)}: {verdict}")
    for c in doc.conditions:
        head = f"  {p(c.type):<22} {p(c.status):<8} {p(c.reason)}"
        problems, more = listed(c)
        if len(problems) == 1 and not more:
            print(f"{head:<57} {p(problems[0])}")
            continue
        print(head)  # a dozen problems read one per line, not as one long line
        for problem in problems:
            print(f"      {p(problem)}")
        if more:
            print(f"      ... and {more} more (--json has them all)")
    for r in doc.rails[:MAX_LISTED]:
        # Not a condition without an nccl section, but what a job without
        # NCCL_IB_GID_INDEX will meet on this node: said before any job runs.
        default, pinned = r.nccl_default_gid_index, r.gid_index_pinned
        if default is not None and pinned is not None and default != pinned:
            print(f"note: {p(r.name)}: NCCL with default settings would pick GID "
                  f"{default}, not the pinned {pinned}: jobs must set "
                  f"NCCL_IB_GID_INDEX={pinned} (or NCCL_IB_ADDR_RANGE)")
    if doc.actions:
        print("would run:" if dry_run else "repaired:")
        for a in doc.actions[:MAX_LISTED]:
            print(f"  {p(a)}")
    for e in doc.errors[:MAX_LISTED]:
        print(f"error: {p(e)}")


def _ipr() -> Any:
    from pyroute2.iproute import IPRoute

    return IPRoute()


def cmd_check(args: argparse.Namespace, repair: bool = False) -> int:
    iproute_without_ssl()  # before the modules below import pyroute2
    from nodeagent.checks.facts import LustreSeen
    from nodeagent.remedies.repairs import Repairs
    from nodeagent.run.evaluate import Evaluator, fabric_pass
    from nodeagent.run.sources import look_once

    cfg = _load(args.config)
    if getattr(args, "config_only", False):
        if args.json:
            json.dump({"config": args.config or default_config_path(), "valid": True},
                      sys.stdout)
            sys.stdout.write("\n")
        else:
            print(f"config {args.config or default_config_path()}: valid")
        return EXIT_OK
    dry_run = bool(getattr(args, "dry_run", False))
    with _ipr() as ipr:
        # check and dry-run change nothing, not even the learned-pin state.
        evaluator = Evaluator(cfg, ipr, persist_pins=repair and not dry_run)
        # The daemon's sources, each read once (the mounts remounted before the pass
        # judges them).
        seen, errors = look_once(cfg, repair=repair and not dry_run)
        early = Repairs(errors=errors)
        for item in seen:
            evaluator.store.deliver(item)
            if isinstance(item, LustreSeen):
                early.other = list(item.remounted)
        report, repairs = fabric_pass(evaluator, repair=repair, dry_run=dry_run, early=early)
        if cfg.transport is not None:  # probe the rails the pass found, then judge again
            from nodeagent.run.transport import probe_targets

            evaluator.store.deliver(probe_targets(evaluator.transport_targets(),
                                                            cfg.transport))
            errors = report.errors  # the pass's problems, as it met them
            report = evaluator.judge(repairs)
            report.errors = errors
    data = report.as_dict()
    if args.json:
        _print_json(data)
    else:
        _print_report(StatusDocument.parse(data, written=False), dry_run=dry_run)
    return EXIT_OK if report.ok else EXIT_NOT_OK


def cmd_run(args: argparse.Namespace) -> int:
    iproute_without_ssl()  # before the modules below import pyroute2
    from nodeagent.io.systemd import setup_logging
    from nodeagent.publish.status import AlreadyRunning, DaemonLock
    from nodeagent.run.agent import Agent

    setup_logging(args.log_level)  # the journal with structured fields under systemd
    path = args.config or default_config_path()
    cfg = load_config(path)
    lock = DaemonLock(cfg.runtime_dir)
    try:
        lock.acquire()  # two daemons on one runtime dir would fight over every rail
    except AlreadyRunning as exc:
        print(f"nodeagent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"nodeagent: cannot lock {lock.path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        agent = Agent(cfg, reload=lambda: load_config(path), lock=lock)
        agent.install_signals()
        return agent.run()
    finally:
        lock.release()


def cmd_status(args: argparse.Namespace) -> int:
    from nodeagent.publish.status import read_status, stale_after, status_path

    cfg = _load(args.config)
    path = status_path(cfg.runtime_dir)
    try:
        view = read_status(cfg.runtime_dir, stale_after(cfg.resync_interval))
    except FileNotFoundError:
        missing = f"no status file at {path}: the daemon has not run"
        if args.json:
            _print_json({"node": cfg.resolved_node_name(), "ok": False, "conditions": [],
                         "actions": [], "daemon": {"running": False, "problem": missing}})
        else:
            print(missing)
        return EXIT_NOT_OK
    except (OSError, ValueError) as exc:
        print(f"cannot read status file {path}: {printable(describe_error(exc))}",
              file=sys.stderr)
        return EXIT_NOT_OK
    data = view.data
    problem: str | None = view.problem
    data["daemon"].update(
        {
            "running": view.running,
            "age_seconds": round(view.age, 3) if view.age != float("inf") else None,
            "stale": view.stale,
            "problem": problem,
        }
    )
    ok = view.doc.ok and not problem
    if args.json:
        _print_json({**data, "ok": ok})
    else:
        _print_report(replace(view.doc, ok=ok))
        print(printable(problem or f"daemon pid {view.doc.pid} running, last pass "
                                   f"{view.age:.1f}s ago"))
    return EXIT_OK if ok else EXIT_NOT_OK


def cmd_alerts(args: argparse.Namespace) -> int:
    import yaml

    from nodeagent.cli.alerts import alert_groups, prometheus_rule, rules_file

    # Without --config the defaults: rules can be made on a workstation with no agent.
    cfg = _load(args.config) if args.config else parse_config({})
    windows = Windows(**{k: getattr(args, k) for k in vars(Windows())})
    groups = alert_groups(cfg, windows)
    doc = (prometheus_rule(groups, args.namespace) if args.format == "prometheusrule"
           else rules_file(groups))
    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        # PromQL over several lines reads best as a literal block.
        return dumper.represent_scalar("tag:yaml.org,2002:str", value,
                                       style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    sys.stdout.write(ALERTS_HEADER + yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=100))
    return EXIT_OK


def cmd_deploy(args: argparse.Namespace) -> int:
    from pathlib import Path

    from nodeagent.cli.deploy import render, write

    # Without --config the defaults, as for alerts: rendered on a workstation with no agent.
    files = render(_load(args.config) if args.config else parse_config({}))
    if args.output_dir:
        for path in write(files, Path(args.output_dir)):
            print(path)
    else:
        sys.stdout.write("---\n".join(files.values()))
    return EXIT_OK


ALERTS_HEADER = "# Generated by `nodeagent alerts`; edit the flags or the config, not this file.\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "check":
            return cmd_check(args)
        if args.command == "apply":
            return cmd_check(args, repair=True)
        if args.command == "run":
            return cmd_run(args)
        if args.command == "alerts":
            return cmd_alerts(args)
        if args.command == "deploy":
            return cmd_deploy(args)
        if args.command == "fleet":
            from nodeagent.cli.fleet import run as run_fleet

            return run_fleet(args)
        if args.command == "preflight":
            from nodeagent.cli.preflight import run as run_preflight

            return run_preflight(args)
        return cmd_status(args)
    except ConfigError as exc:
        for line in exc.problems:
            print(f"nodeagent: invalid config: {line}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
