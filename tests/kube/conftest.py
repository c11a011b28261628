from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.kit.apiserver import ApiServer, start_apiserver


@pytest.fixture
def core(apiserver: ApiServer) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(apiserver.client("admin"))


@pytest.fixture
def fresh_node(core: k8s.CoreV1Api) -> Callable[..., str]:
    """Create (or re-create) a Node with the given taints; returns its name."""
    made: list[str] = []

    def make(name: str = "node-a", taints: list[dict[str, Any]] | None = None) -> str:
        try:
            core.delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        for _ in range(100):
            try:
                core.create_node({"metadata": {"name": name},  # type: ignore[arg-type]
                                  "spec": {"taints": taints or []}})
                break
            except ApiException as exc:
                if exc.status != 409:  # still being deleted
                    raise
                time.sleep(0.1)
        made.append(name)
        return name

    return make


@pytest.fixture
def kube_tmp(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def own_apiserver(tmp_path: Path) -> Iterator[ApiServer]:
    """An API server of this test's own (deploy/ applied), free to be stopped, started
    again or given other policies."""
    server = start_apiserver(tmp_path / "apiserver")
    try:
        yield server
    finally:
        server.stop()
