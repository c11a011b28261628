"""Configuration: YAML -> validated, typed objects, or one line per problem.

Every problem is reported as `<key path>: <what is wrong>` (`rails[1].address: ...`), so an
operator can fix a bad inventory without reading a traceback. Nothing is applied from a config
that has any problem.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

DEFAULT_CONFIG_PATH = "/etc/nodeagent/config.yaml"
CONFIG_ENV = "NODEAGENT_CONFIG"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_IFNAME = re.compile(r"^[^\s/:]{1,15}$")  # kernel IFNAMSIZ-1, no '/', ':' or whitespace
# Linux reserves these routing tables: 253 default, 254 main, 255 local (0 = unspecified).
_RESERVED_TABLES = {0, 253, 254, 255}


class ConfigError(Exception):
    """An invalid configuration: `problems` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def parse_duration(value: Any) -> float:
    """'5s', '500ms', '2m', '1h' or a plain number of seconds -> seconds (float)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration (use e.g. 30s, 500ms, 2m)")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration (use e.g. 30s, 500ms, 2m)")
    if seconds < 0:
        raise ValueError(f"{value!r} is negative")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


class _Strict(BaseModel):
    # Unknown keys are errors: a typo must never silently disable a check.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Paths(_Strict):
    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    lfs: str = "lfs"  # the Lustre `lfs` tool (name on PATH or a path); skipped when absent
    rdma: str = "rdma"  # iproute2's `rdma` tool: lists QPs before a GID is re-pinned


# Rail sysctls the agent knows how to enforce: name -> (procfs subtree, allowed values).
RAIL_SYSCTLS: dict[str, tuple[str, range]] = {
    "arp_ignore": ("net/ipv4/conf", range(0, 9)),
    "arp_announce": ("net/ipv4/conf", range(0, 3)),
    "rp_filter": ("net/ipv4/conf", range(0, 3)),
    "accept_ra": ("net/ipv6/conf", range(0, 3)),
    "addr_gen_mode": ("net/ipv6/conf", range(0, 4)),
    "disable_ipv6": ("net/ipv6/conf", range(0, 2)),
}
# What multi-rail RoCE hosts want (design notes): answer ARP only for the rail's own
# address, announce with it, loose reverse-path filtering, no router advertisements.
DEFAULT_RAIL_SYSCTLS = {"arp_ignore": 1, "arp_announce": 2, "rp_filter": 2, "accept_ra": 0}


def _check_sysctls(value: dict[str, int]) -> dict[str, int]:
    for key, val in value.items():
        if key not in RAIL_SYSCTLS:
            known = ", ".join(sorted(RAIL_SYSCTLS))
            raise ValueError(f"unknown rail sysctl {key!r} (known: {known})")
        allowed = RAIL_SYSCTLS[key][1]
        if val not in allowed:
            raise ValueError(f"{key}={val} is out of range {allowed.start}..{allowed.stop - 1}")
    return value


class Rail(_Strict):
    name: str = Field(min_length=1)
    interface: str
    address: str  # validated below: IPv4 interface address with prefix
    mtu: int | None = Field(default=None, ge=68, le=65535)
    table: int | None = None
    rule_priority: int | None = Field(default=None, ge=0, le=2**32 - 1)
    gateway: str | None = None
    gid_index: int | None = Field(default=None, ge=0)
    rdma_device: str | None = None  # found from gid_attrs/ndevs when not set
    rdma_port: int = Field(default=1, ge=1)
    exclusive: bool = False  # remove addresses on the interface that the config does not name
    sysctls: dict[str, int] | None = None  # overrides the top-level rail_sysctls

    @field_validator("interface")
    @classmethod
    def _ifname(cls, v: str) -> str:
        if not _IFNAME.match(v):
            raise ValueError(f"{v!r} is not a valid interface name")
        return v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        if "/" not in v:
            raise ValueError(f"{v!r} has no prefix length (e.g. 10.10.0.5/24)")
        try:
            iface = ipaddress.IPv4Interface(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an IPv4 interface address") from None
        return str(iface)

    @field_validator("gateway")
    @classmethod
    def _gateway(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            return str(ipaddress.IPv4Address(v))
        except ValueError:
            raise ValueError(f"{v!r} is not an IPv4 address") from None

    @field_validator("table")
    @classmethod
    def _table(cls, v: int | None) -> int | None:
        if v is not None and (v in _RESERVED_TABLES or not 0 < v < 2**32):
            raise ValueError(f"{v} is reserved or out of range (use 1..252 or 256..4294967295)")
        return v

    @field_validator("sysctls")
    @classmethod
    def _sysctls(cls, v: dict[str, int] | None) -> dict[str, int] | None:
        return None if v is None else _check_sysctls(v)

    @property
    def ip(self) -> str:
        return str(ipaddress.IPv4Interface(self.address).ip)

    @property
    def prefixlen(self) -> int:
        return ipaddress.IPv4Interface(self.address).network.prefixlen

    @property
    def network(self) -> str:
        return str(ipaddress.IPv4Interface(self.address).network)

    @property
    def label(self) -> str:
        """How messages name the rail: 'rail0 ens1f0'."""
        return f"{self.name} {self.interface}"


class LinkFlap(_Strict):
    window: Duration = 60.0  # sliding window for counting carrier losses
    max_flaps: int = Field(default=3, ge=1)  # more than this in the window: LinkFlapping
    dwell: Duration = 30.0  # carrier stable this long before LinkFlapping clears


class RepairGuard(_Strict):
    max_repairs: int = Field(default=5, ge=1)  # same drift repaired more than this in window
    window: Duration = 60.0
    backoff: Duration = 300.0  # then stop fighting for this long: ManagedElsewhere


class Registry(_Strict):
    """How the plugin's image is looked up in its registry (OCI distribution API)."""

    verify_platform: bool = True  # off: the image-platform fact is not checked at all
    ca_bundle: Path | None = None  # PEM roots for registry TLS; None: the system's roots
    docker_config: Path | None = None  # docker-config JSON with credentials (pull-secret form)
    timeout: Duration = 10.0  # per registry lookup, all requests and redirects included
    max_bytes: int = Field(default=4 << 20, ge=1024)  # larger replies are refused


class DevicePlugin(_Strict):
    namespace: str = "kube-system"
    daemonset: str = "rdma-shared-dp-ds"
    resource: str = "rdma/rdma_shared_device_a"
    min_allocatable: int = Field(default=1, ge=0)
    interval: Duration = 30.0  # how often its objects are read (off the main loop)
    registry: Registry = Registry()


class FabricTraffic(_Strict):
    """FabricTrafficOnRDMA: kernel-stack bytes growing while RDMA counters stay flat."""

    expect: Literal["pods", "always", "never"] = "pods"  # pods: while pods here request
    #   the device plugin's resource or one of `pod_resources`
    pod_resources: list[str] = Field(default_factory=lambda: ["nvidia.com/gpu"])
    window: Duration = 120.0
    min_kernel_bytes: int = Field(default=100 << 20, ge=0)  # more than this via the kernel ...
    flat_rdma_bytes: int = Field(default=0, ge=0)  # ... while RDMA moved at most this
    flat_rdma_packets: int = Field(default=0, ge=0)  # the same for devices counting packets only
    gate: bool = False  # true: part of FabricReady (a failure taints the node)


class Metrics(_Strict):
    listen: str = "127.0.0.1:9464"  # host:port of the Prometheus endpoint (loopback)

    @field_validator("listen")
    @classmethod
    def _hostport(cls, v: str) -> str:
        _host, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{v!r} is not host:port (e.g. 127.0.0.1:9464)")
        return v


class LustreMount(_Strict):
    mountpoint: str
    source: str  # as mountinfo shows it: MGS NIDs and fsname, e.g. 10.0.0.1@o2ib:/scratch
    timeout: Duration = 5.0  # statfs (in a child process) must answer within this
    fstype: str = "lustre"
    options: list[str] = Field(default_factory=list)  # required mount options, e.g. [flock]
    remount_command: list[str] | None = None  # optional repair (argv), off by default
    remount_timeout: Duration = 60.0

    @field_validator("mountpoint")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"{v!r} is not an absolute path")
        return v.rstrip("/") or "/"


class Taint(_Strict):
    key: str = "nodeagent.io/fabric-unready"
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class Kubernetes(_Strict):
    kubeconfig: str | None = None  # None: in-cluster or $KUBECONFIG
    taint: Taint = Taint()
    cordon: bool = False
    clear_after: Duration = 30.0  # all conditions True this long before the taint is lifted
    lease_namespace: str = "nodeagent-system"
    lease_period: Duration = 20.0  # heartbeat: Lease renewed this often
    reconcile_interval: Duration = 600.0  # re-read the Node even when nothing changed
    event_burst: int = Field(default=10, ge=1)  # Events: token bucket of this size ...
    event_rate: float = Field(default=0.2, gt=0)  # ... refilled at this many per second


def _at_least(seconds: float, floor: float, shown: str) -> float:
    if seconds < floor:
        raise ValueError(f"{seconds}s is too short (at least {shown})")
    return seconds


class Config(_Strict):
    node_name: str | None = None  # default: $NODE_NAME, else the hostname
    paths: Paths = Paths()
    state_dir: Path = Path("/var/lib/nodeagent")
    runtime_dir: Path = Path("/run/nodeagent")
    resync_interval: Duration = 30.0
    # Receive buffer of the netlink event socket; on overflow the agent resyncs everything.
    netlink_rcvbuf: int = Field(default=1 << 20, ge=4096, le=1 << 30)
    rails: list[Rail] = Field(default_factory=list)
    rail_sysctls: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_RAIL_SYSCTLS))
    gid_source: Literal["auto", "pyverbs", "sysfs"] = "auto"
    # A GID found off its pinned index is put back (the rail's address deleted and re-added)
    # once no QP uses the port any more: auto. never: only reported.
    gid_repin: Literal["auto", "never"] = "auto"
    gid_repin_poll: Duration = 5.0  # while a GID is shifted, QPs are looked at this often
    link_flap: LinkFlap = LinkFlap()
    repair_guard: RepairGuard = RepairGuard()
    device_plugin: DevicePlugin | None = None
    fabric_traffic: FabricTraffic | None = None
    metrics: Metrics | None = None  # the Prometheus endpoint; off without this section
    lustre: list[LustreMount] | None = None
    lustre_interval: Duration = 10.0  # how often the mounts are probed (off the main loop)
    kubernetes: Kubernetes | None = None

    @field_validator("rail_sysctls")
    @classmethod
    def _sysctls(cls, v: dict[str, int]) -> dict[str, int]:
        return _check_sysctls(v)

    @field_validator("resync_interval")
    @classmethod
    def _resync(cls, v: float) -> float:
        return _at_least(v, 1.0, "1s")

    @field_validator("gid_repin_poll")
    @classmethod
    def _repin_poll(cls, v: float) -> float:
        return _at_least(v, 0.1, "100ms")  # 0 would spin the main loop

    def resolved_node_name(self) -> str:
        return self.node_name or os.environ.get("NODE_NAME") or socket.gethostname()

    def sysctls_for(self, rail: Rail) -> dict[str, int]:
        return dict(self.rail_sysctls if rail.sysctls is None else rail.sysctls)


# ---------------------------------------------------------------- loading


def _path(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _describe(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    msg = str(error["msg"])
    msg = msg.removeprefix("Value error, ")
    if kind != "value_error" and "input" in error:
        msg += f" (got {error['input']!r})"
    return msg


def _semantic_problems(cfg: Config) -> list[str]:
    """Cross-field rules pydantic cannot place on one key."""
    problems: list[str] = []
    seen: dict[str, dict[str, int]] = {"name": {}, "interface": {}, "ip": {}, "table": {}}
    for i, rail in enumerate(cfg.rails):
        where = f"rails[{i}]"
        for key, value in (
            ("name", rail.name),
            ("interface", rail.interface),
            ("ip", rail.ip),
            ("table", rail.table),
        ):
            if value is None:
                continue
            first = seen[key].get(str(value))
            if first is not None:
                shown = "address" if key == "ip" else key
                problems.append(f"{where}.{shown}: {value!r} duplicates rails[{first}].{shown}")
            else:
                seen[key][str(value)] = i
        if rail.rule_priority is not None and rail.table is None:
            problems.append(f"{where}.rule_priority: set without {where}.table")
        if rail.gateway is not None:
            if rail.table is None:
                problems.append(f"{where}.gateway: set without {where}.table")
            elif ipaddress.IPv4Address(rail.gateway) not in ipaddress.IPv4Network(rail.network):
                problems.append(
                    f"{where}.gateway: {rail.gateway} is outside the rail subnet {rail.network}"
                )
            elif rail.gateway == rail.ip:
                problems.append(f"{where}.gateway: {rail.gateway} is the rail's own address")
    if cfg.lustre:
        mounts: dict[str, int] = {}
        for i, mount in enumerate(cfg.lustre):
            if mount.mountpoint in mounts:
                problems.append(
                    f"lustre[{i}].mountpoint: {mount.mountpoint!r} duplicates "
                    f"lustre[{mounts[mount.mountpoint]}].mountpoint"
                )
            mounts.setdefault(mount.mountpoint, i)
    return problems


def parse_config(data: Any) -> Config:
    """Validate already-parsed YAML data; raise ConfigError with every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"(top level): expected a mapping of keys, got {type(data).__name__}"])
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([f"{_path(e['loc'])}: {_describe(e)}" for e in exc.errors()]) from None
    problems = _semantic_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def default_config_path() -> str:
    return os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a YAML file; every problem line is prefixed with the file name."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{name}: config file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{name}: cannot read config: {exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{name}: {where}invalid YAML: {problem}"]) from None
    try:
        return parse_config(data)
    except ConfigError as exc:
        raise ConfigError([f"{name}: {p}" for p in exc.problems]) from None
