"""One version: the package's `__version__` is what the chart, its default image tag and the
kustomization's image tag name, and what tools/build-image tags the image with (from the
wheel's name): a release that bumps one and not the others is caught here."""

from __future__ import annotations

from pathlib import Path

import yaml

from nodeagent import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_the_deploy_manifests_name_the_packages_version() -> None:
    chart = yaml.safe_load((ROOT / "charts/nodeagent/Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts/nodeagent/values.yaml").read_text())
    kustomization = yaml.safe_load((ROOT / "deploy/daemonset/kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert {"chart appVersion": chart["appVersion"], "chart version": chart["version"],
            "values image.tag": str(values["image"]["tag"]),
            "kustomization newTag": str(image["newTag"])} == dict.fromkeys(
        ("chart appVersion", "chart version", "values image.tag", "kustomization newTag"),
        __version__)
