"""The one way nodeagent talks HTTP to the API server: plain JSON, a timeout on every call.

Shared by the read-only probe (probes/kube.py) and the only writer (publish/kube.py). The
kubernetes client's typed models are not used for bodies: they coerce and re-serialize
(e.g. drop the microseconds a Lease's MicroTime must have), and cost memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.kube_config import KubeConfigLoader

from nodeagent.config import Kubernetes
from nodeagent.io.files import CONFIG_MAX, parse_json_state, read_text_bounded
from nodeagent.io.http import READ_CHUNK, TRACKED_POOLS, BodyTooLarge, deadline, read_body
from nodeagent.io.safeyaml import safe_yaml

TIMEOUT = (3.0, 10.0)  # connect, read (seconds): a dead API server must not hang anything
REQUEST_DEADLINE = 15.0  # a whole request, headers and body: a trickling server cannot hold it
# One reply, one watch event: far above what the agent reads (its Node, its DaemonSet, the
# pods on its node: tens of KiB). A server that sends more is refused, not buffered. The
# agent's own is kubernetes.max_reply (this by default).
MAX_REPLY = 64 << 20
# `kubectl fabric` lists every Node and Lease at once: ~15 KiB a Node, so 10,000 Nodes
# are ~150 MB.
FLEET_MAX_REPLY = 1 << 30
# A reply (or a watch event) over its limit: the HTTP layer's one bounded reader says so.
ReplyTooLarge = BodyTooLarge


class ApiClient(k8s.ApiClient):
    """The kubernetes client, its connections tracked for request deadlines."""

    request_deadline = REQUEST_DEADLINE
    max_reply = MAX_REPLY

    def __init__(self, conf: k8s.Configuration, request_deadline: float,
                 max_reply: int = MAX_REPLY) -> None:
        super().__init__(conf)
        self.request_deadline = request_deadline
        self.max_reply = max_reply
        self.rest_client.pool_manager.pool_classes_by_scheme = dict(TRACKED_POOLS)


def _load_kubeconfig(path: Path, conf: k8s.Configuration, context: str | None = None) -> None:
    # Read bounded (a FIFO or a huge file is refused) and parsed with the config's own YAML
    # limits (no alias bombs), then handed to the client's loader; certificate paths inside
    # stay relative to the kubeconfig's directory, as kubectl reads them.
    data = safe_yaml(read_text_bounded(path, CONFIG_MAX))
    if not isinstance(data, dict):
        raise k8s_config.ConfigException(f"{path}: not a kubeconfig (not a mapping)")
    KubeConfigLoader(config_dict=data, config_base_path=str(path.parent),
                     active_context=context).load_and_set(conf)


def kubectl_kubeconfig(flag: str | None, env: dict[str, str] | None = None,
                       home: Path | None = None) -> Path | None:
    """The kubeconfig kubectl would use: --kubeconfig, else the first existing file of
    $KUBECONFIG, else ~/.kube/config when it exists; None means in-cluster."""
    if flag:
        return Path(flag)
    env = dict(os.environ) if env is None else env
    for entry in (env.get("KUBECONFIG") or "").split(os.pathsep):
        if entry and Path(entry).expanduser().is_file():
            return Path(entry).expanduser()
    default = (home or Path.home()) / ".kube" / "config"
    return default if default.is_file() else None


def user_client(kubeconfig: str | None, context: str | None,
                request_deadline: float = REQUEST_DEADLINE) -> ApiClient:
    """A client for a person's command (kubectl fabric), found in kubectl's order."""
    conf = k8s.Configuration()
    path = kubectl_kubeconfig(kubeconfig)
    if path is not None:
        _load_kubeconfig(path, conf, context)
    elif context:
        raise k8s_config.ConfigException(f"--context {context}: no kubeconfig to find it in")
    elif not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise k8s_config.ConfigException(
            "no kubeconfig: none given (--kubeconfig), none in $KUBECONFIG, no "
            "~/.kube/config, and not in a pod (KUBERNETES_SERVICE_HOST is not set)")
    else:
        k8s_config.load_incluster_config(client_configuration=conf)
    conf.retries = False
    return ApiClient(conf, request_deadline, FLEET_MAX_REPLY)


def incluster_client(request_deadline: float = REQUEST_DEADLINE) -> ApiClient:
    """A client with the pod's own service-account token (nodeagent preflight)."""
    conf = k8s.Configuration()
    k8s_config.load_incluster_config(client_configuration=conf)
    conf.retries = False
    return ApiClient(conf, request_deadline)


def api_client(cfg: Kubernetes, request_deadline: float = REQUEST_DEADLINE) -> ApiClient:
    """An ApiClient from the configured kubeconfig, else in-cluster, else $KUBECONFIG."""
    conf = k8s.Configuration()
    if cfg.kubeconfig:
        _load_kubeconfig(Path(cfg.kubeconfig), conf)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=conf)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=conf)
    conf.retries = False  # callers retry themselves, with the newest state
    return ApiClient(conf, request_deadline, cfg.max_reply)


@dataclass
class Counters:
    requests: int = 0
    writes: int = 0
    conflicts: int = 0
    errors: int = 0
    events_dropped: int = 0
    bytes_in: int = 0  # reply bodies read


def call(
    api: k8s.ApiClient,
    counters: Counters,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
    query: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """One request; raises ApiException (with the API's status body) unless 2xx."""
    counters.requests += 1
    if method != "GET":
        counters.writes += 1
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    _, url, headers, data, post = api.param_serialize(
        method=method, resource_path=path, query_params=query, header_params=headers,
        body=body, auth_settings=["BearerToken"])
    seconds = getattr(api, "request_deadline", REQUEST_DEADLINE)
    try:
        with deadline(seconds):
            resp = api.call_api(method, url, header_params=headers, body=data,
                                post_params=post, _request_timeout=TIMEOUT)
            reply = read_body(resp.response, getattr(api, "max_reply", MAX_REPLY),
                              f"{method} {path}")
    except ReplyTooLarge:
        counters.errors += 1
        raise
    except Exception as exc:
        counters.errors += 1  # refused, timed out, TLS
        raise _unreachable(api, exc) from exc
    counters.bytes_in += len(reply)
    if not 200 <= resp.status < 300:
        counters.errors += 1
        if resp.status == 409:
            counters.conflicts += 1
        raise ApiException(status=resp.status, reason=resp.reason,
                           body=reply.decode("utf-8", "replace"))
    try:
        result = parse_json_state((reply or b"{}").decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError too
        raise ValueError(f"{method} {path}: reply is not JSON: {exc}") from None
    if not isinstance(result, dict):
        raise ValueError(f"{method} {path}: reply is not a JSON object")
    return result


_HOST = re.compile(r"host='([^']+)', port=(\d+)")
_QUOTED = re.compile(r"'([^']*)'")
_VERIFY = re.compile(r"certificate verify failed:? ?([^'\"()]*)")
MAX_ERROR = 500


class ApiUnreachable(ConnectionError):
    """No answer from the API server: the TLS verification, the connection or the deadline
    failed. Its text says which, and for which server."""


def api_error_text(exc: BaseException) -> str:
    """What failed, in one line: the API's answer (its HTTP status and the Status object's
    message: a 403 names the rule), or why no answer came, with the server it was for (the
    TLS verification, a refused or timed-out connection). The client library reports a TLS
    failure as an ApiException of status 0, whose text begins with the bare "(0)"."""
    if isinstance(exc, ApiUnreachable):
        return str(exc)[:MAX_ERROR]
    status = getattr(exc, "status", None)
    if status:
        body, message = getattr(exc, "body", None), ""
        if body:
            try:
                message = str(json.loads(body).get("message", ""))
            except (ValueError, AttributeError):
                message = str(body)
        reason = getattr(exc, "reason", None)
        text = f"HTTP {status}: {message}" if message else f"HTTP {status}" + (
            f" {reason}" if reason else "")
        return " ".join(text.split())[:MAX_ERROR]
    text = str(getattr(exc, "reason", "") or exc) if isinstance(exc, ApiException) else str(exc)
    host = _HOST.search(text)
    return _no_answer(text, f" ({host.group(1)}:{host.group(2)})" if host else "", exc)


def _no_answer(text: str, at: str, exc: BaseException) -> str:
    verify = _VERIFY.search(text)
    if verify:
        detail = verify.group(1).strip()
        return f"TLS: certificate verify failed{': ' + detail if detail else ''}{at}"[:MAX_ERROR]
    if "Caused by" in text:  # urllib3: the pool, then the error that gave up the retries
        quoted = _QUOTED.findall(text.rsplit("Caused by", 1)[1])
        if quoted:  # after urllib3's "<...HTTPSConnection object at 0x...>: "
            return f"{quoted[-1].split('>: ', 1)[-1]}{at}"[:MAX_ERROR]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].isidentifier():  # the library's "SSLError\n<text>"
        lines = [f"{lines[0]}: {lines[1]}"]
    return ((lines[0] if lines else type(exc).__name__) + at)[:MAX_ERROR]


def _unreachable(api: k8s.ApiClient, exc: Exception) -> Exception:
    """A request that got no answer, as ApiUnreachable naming its server; an answer (an
    ApiException with an HTTP status) as it is."""
    if getattr(exc, "status", None):
        return exc
    server = urllib.parse.urlsplit(str(getattr(api.configuration, "host", "") or "")).netloc
    text = str(getattr(exc, "reason", "") or exc) if isinstance(exc, ApiException) else str(exc)
    return ApiUnreachable(_no_answer(text, f" ({server})" if server else "", exc))


def is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 409


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404


def watch(
    api: k8s.ApiClient,
    counters: Counters,
    path: str,
    query: list[tuple[str, str]],
    timeout: float,
) -> WatchStream:
    """Starts one watch request (raises ApiException unless 200). Its events end when the
    server closes the watch (its timeoutSeconds); a read stalled past `timeout` raises a
    urllib3 error."""
    counters.requests += 1
    _, url, headers, _, _ = api.param_serialize(
        method="GET", resource_path=path, query_params=[*query, ("watch", "1")],
        header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
    try:
        resp = api.call_api("GET", url, header_params=headers, _request_timeout=(3.0, timeout))
    except Exception as exc:
        raise _unreachable(api, exc) from exc
    if resp.status != 200:
        reply = read_body(resp.response, getattr(api, "max_reply", MAX_REPLY), f"watch {path}")
        raise ApiException(status=resp.status, reason=resp.reason,
                           body=reply.decode("utf-8", "replace"))
    return WatchStream(resp.response, getattr(api, "max_reply", MAX_REPLY))


class WatchStream:
    """The events of one watch, as they arrive. close() from another thread ends it."""

    def __init__(self, raw: Any, limit: int = MAX_REPLY) -> None:
        self.raw = raw
        self.limit = limit

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """One event per line. Each chunk is searched once (a line of many chunks is joined
        once, when its newline comes: before, every chunk re-split all that was pending, so
        a 200 MB line cost 30 s of CPU); a line past MAX_REPLY ends the watch."""
        partial: list[bytes] = []  # the line so far: chunks with no newline yet
        size = 0
        try:
            for chunk in self.raw.stream(READ_CHUNK):
                start = 0
                while (end := chunk.find(b"\n", start)) >= 0:
                    line = b"".join([*partial, chunk[start:end]])
                    partial, size, start = [], 0, end + 1
                    if len(line) > self.limit:
                        raise ReplyTooLarge(f"a watch event over the {self.limit} bytes allowed")
                    if line.strip():
                        event: dict[str, Any] = json.loads(line)
                        yield event
                if start < len(chunk):
                    partial.append(chunk[start:])
                    size += len(chunk) - start
                    if size > self.limit:
                        raise ReplyTooLarge(f"a watch event over the {self.limit} bytes allowed")
        finally:
            # Never back to the pool half-read: the next watch opens a connection of its own.
            self.raw.close()

    def close(self) -> None:
        """Ends the watch from another thread. Shut the socket down rather than close the
        response: close() waits for the lock the reading thread holds until data comes."""
        sock = getattr(self.raw.connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
