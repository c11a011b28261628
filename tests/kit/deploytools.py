"""helm and kustomize for the DaemonSet-mode tests, built from their Go modules
(tools/deploytools/<tool>/go.mod, one module each: their Kubernetes libraries differ;
neither tool is packaged in Debian) and cached by source hash."""

from __future__ import annotations

from pathlib import Path

from tests.kit.apiserver import go_build, module_hash
from tests.kit.helpers import build_cache

SRC = Path(__file__).resolve().parents[2] / "tools" / "deploytools"
PACKAGES = {"helm": "helm.sh/helm/v3/cmd/helm",
            "kustomize": "sigs.k8s.io/kustomize/kustomize/v5"}


def build_tool(name: str) -> Path:
    """`helm` or `kustomize`, built when missing or when its module changed."""
    src = SRC / name
    return go_build(build_cache("deploytools") / f"{name}-{module_hash(src)}",
                    ["-ldflags=-s -w", PACKAGES[name]], src, name)
