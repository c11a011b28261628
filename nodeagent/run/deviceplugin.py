"""The device-plugin thread: reads the plugin's Kubernetes objects every interval and hands
each observation to the loop, remembering which plugin pods it has ever seen Ready (so
"never Ready" survives a restart of the agent)."""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from nodeagent.checks.deviceplugin import newest_pod, plugin_images
from nodeagent.checks.facts import PluginSeen
from nodeagent.config import Config, DevicePlugin, Registry, Runtime
from nodeagent.io.files import (
    STATE_MAX,
    one_line,
    parse_json_state,
    read_text_bounded,
    write_json_atomic,
)
from nodeagent.io.periodic import Periodic
from nodeagent.model.kube import DevicePluginObservation, ImagePlatforms
from nodeagent.probes.registry import RegistryClient, RegistryError
from nodeagent.probes.runtime import container_log_lines, stored_image_platforms
from nodeagent.run.work import Deliver

if TYPE_CHECKING:  # the client library only when configured
    from nodeagent.kube.watch import WatchedCollection

log = logging.getLogger(__name__)
SEEN_FILE = "plugin-pods-seen-ready.json"
MAX_REMEMBERED = 256


def plugin_reader(
    cfg: Config, on_change: Callable[[], None] | None = None,
    node_watch: Callable[[], WatchedCollection | None] | None = None,
) -> Callable[[DevicePlugin], DevicePluginObservation]:
    """Reads the plugin's objects with the agent's identity, then asks the registry what its
    images offer. With `on_change` (the daemon) the objects are watched and `on_change` is
    called when they change; without it (the CLI) each call reads them once. Clients are
    made on first use; failing to make them, or to read, gives an Unknown observation (or
    an Unknown image fact), never an exception. `node_watch`: the daemon's one watch of its
    own Node, which the daemon's reader follows instead of opening its own."""
    readers: dict[DevicePlugin, Any] = {}
    registries: dict[Registry, RegistryClient] = {}

    def reader(dp: DevicePlugin) -> Any:
        if dp not in readers:
            from nodeagent.kube.api import api_client  # kubernetes only when configured
            from nodeagent.probes.kube import KubeReader, WatchingReader

            for old in readers.values():
                if isinstance(old, WatchingReader):
                    old.stop()
            readers.clear()
            assert cfg.kubernetes is not None
            api = api_client(cfg.kubernetes, cfg.kubernetes.request_timeout)
            node = cfg.resolved_node_name()
            readers[dp] = (KubeReader(api, node) if on_change is None
                           else WatchingReader(api, node, dp, on_change,
                                               node_watch=node_watch))
        return readers[dp]

    def read(dp: DevicePlugin) -> DevicePluginObservation:
        try:
            obs: DevicePluginObservation = reader(dp).device_plugin(dp)
        except Exception as exc:  # e.g. a kubeconfig that cannot be loaded
            return DevicePluginObservation(error=one_line(exc, 300))
        if obs.error:
            return obs
        obs = replace(obs, machine=platform.machine())
        if dp.runtime.enabled:
            obs = with_runtime_facts(obs, dp.runtime)
        if not dp.registry.verify_platform:
            return obs
        images = plugin_images(obs)
        try:
            if dp.registry not in registries:
                registries.clear()
                registries[dp.registry] = registry_client(dp.registry)
            client = registries[dp.registry]
            found = tuple(client.image_platforms(image) for image in images)
        except RegistryError as exc:  # e.g. an unreadable docker config
            found = tuple(ImagePlatforms(image=image, error=str(exc)) for image in images)
        return replace(obs, images=found)

    return read


def with_runtime_facts(obs: DevicePluginObservation, runtime: Runtime) -> DevicePluginObservation:
    """The newest plugin pod's pulled images and newest log lines, as this node's runtime
    stored them."""
    pod = newest_pod(obs)
    if pod is None:
        return obs
    images: dict[str, ImagePlatforms] = {}
    logs: dict[str, list[str]] = {}
    for c in pod.containers:
        if not c.reported:
            continue
        if c.image_id:
            images[c.name] = stored_image_platforms(runtime.content_store, c.image, c.image_id)
        logs[c.name] = container_log_lines(runtime.pod_logs, pod, c.name)
    return replace(obs, runtime_images=images, log_lines=logs)


def registry_client(reg: Registry) -> RegistryClient:
    return RegistryClient(ca_bundle=reg.ca_bundle, docker_config=reg.docker_config,
                          timeout=reg.timeout, max_bytes=reg.max_bytes)


def load_seen_ready(cfg: Config) -> list[str]:
    try:
        data = parse_json_state(read_text_bounded(cfg.state_dir / SEEN_FILE, STATE_MAX))
    except (OSError, ValueError):
        return []  # only a memory of pods once Ready: forgetting it is safe
    return [u for u in data if isinstance(u, str)][:10_000] if isinstance(data, list) else []


class DevicePluginMonitor(Periodic):
    """Delivers an observation when the watched objects change (coalesced) and at least
    every `interval` (the registry lookups, cached per digest, run then too)."""

    COALESCE = 0.2  # a burst of watch events (a pod starting) makes one observation

    def __init__(
        self,
        cfg: Config,
        make_reader: Callable[[Callable[[], None]], Callable[[DevicePlugin],
                                                             DevicePluginObservation]],
        deliver: Deliver,
    ) -> None:
        super().__init__("device-plugin-monitor")
        self.cfg = cfg
        self.read = make_reader(self.wake)
        self.deliver = deliver
        self.seen_ready = load_seen_ready(cfg)

    def remember(self, obs: DevicePluginObservation) -> None:
        new = [p.uid for p in obs.pods if p.ready and p.uid and p.uid not in self.seen_ready]
        if not new:
            return
        self.seen_ready = (self.seen_ready + new)[-MAX_REMEMBERED:]
        try:
            write_json_atomic(self.cfg.state_dir / SEEN_FILE, self.seen_ready)
        except OSError as exc:
            log.error("cannot save %s: %s", SEEN_FILE, exc)

    def turn(self) -> float:
        dp = self.cfg.device_plugin  # may change on reload
        if dp is None:
            return 30.0
        obs = self.read(dp)
        self.remember(obs)
        self.deliver(PluginSeen(obs, frozenset(self.seen_ready)))
        return dp.interval

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg
        self.wake()

    def pause(self, seconds: float) -> bool:
        woken = super().pause(seconds)
        if woken and not self.halted:
            self._alarm.linger(self.COALESCE)
        return woken
