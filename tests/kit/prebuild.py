"""Every cached artefact the tiers use, built ahead of the tests that need them.

tools/test starts this in the background (niced) while the tiers that need none of it run:
the Go builds wait on the CPU, the agent image's layers on the network and the disk, so
the two go side by side. Each build takes the artefact's build lock, so a test that needs
one meanwhile waits for it instead of building it twice; the lab's own process builds the
lab image, which it needs first.

    python -m tests.kit.prebuild           build what is missing, in the order the tiers need it
    python -m tests.kit.prebuild --report LOG [JUNIT ...]
                                           where the time went: each artefact built (seconds)
                                           or cached, then the tests' totals
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from tests.kit.apiserver import build_kube_binary, build_kubectl, build_testenv
from tests.kit.deploytools import build_tool
from tests.kit.helpers import build_cache, record_build
from tests.kit.images import build_program
from tests.kit.kueue import build_kueue
from tools import imagebuild

# In the order the main tiers meet them: the kube tier needs the API server, kubectl (its
# first module, the condition contract), then helm and kustomize; the kubelet tier the
# node's binaries and the test programs, then Kueue.
GO_BUILDS: list[tuple[str, Callable[[], Path]]] = [
    ("tools/testenv (kube-apiserver and etcd)", build_testenv),
    ("kubectl", build_kubectl),
    ("helm", lambda: build_tool("helm")),
    ("kustomize", lambda: build_tool("kustomize")),
    ("kubelet", lambda: build_kube_binary("kubelet")),
    ("kube-controller-manager", lambda: build_kube_binary("kube-controller-manager")),
    ("kube-scheduler", lambda: build_kube_binary("kube-scheduler")),
    *[(f"tools/testenv/{p} for {a}", (lambda p=p, a=a: build_program(p, a)))
      for p, a in (("deviceplugin", "amd64"), ("deviceplugin", "arm64"), ("pause", "amd64"))],
    ("kueue", build_kueue),
]


def agent_image() -> None:
    """The agent image's Debian and dependency layers (cached by recipe; the app layer is
    rebuilt by each build, seconds)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        imagebuild.build(Path(tmp) / "layout", build_cache("image"))
    record_build("agent image (tools/imagebuild.py)", time.monotonic() - started)


def prebuild() -> int:
    failures: list[str] = []

    def image() -> None:
        try:
            agent_image()
        except Exception as exc:  # the package tier's own build will say it again, loudly
            failures.append(f"agent image: {exc}")

    side = threading.Thread(target=image, name="agent-image")
    side.start()
    for what, build in GO_BUILDS:
        try:
            build()
        except Exception as exc:
            failures.append(f"{what}: {exc}")
    side.join()
    for line in failures:
        print(f"prebuild: {line}", file=sys.stderr)
    return 1 if failures else 0


def report(log: Path, junits: list[Path]) -> int:
    """Print what was built this run and what the tests counted; the last line is the
    suite's total (`all: N passed, N failed`)."""
    built = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    print("\n==== where the time went: cached artefacts ====")
    for entry in built:
        print(f"  built {entry['what']}: {entry['seconds']:.0f} s")
    print(f"  {len(built)} built this run; whatever else the tiers used was cached"
          if built else "  everything was cached")
    passed = failed = skipped = 0
    for path in junits:
        if not path.exists():
            failed += 1
            print(f"  {path.name}: no result (the tier did not finish)")
            continue
        for suite in ET.parse(path).getroot().iter("testsuite"):
            tests = int(suite.get("tests", 0))
            bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            skip = int(suite.get("skipped", 0))
            passed, failed, skipped = passed + tests - bad - skip, failed + bad, skipped + skip
            print(f"  {path.stem}: {tests - bad - skip} passed, {bad} failed in "
                  f"{float(suite.get('time', 0)):.0f} s")
    print(f"all: {passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", type=Path, metavar="LOG")
    p.add_argument("junit", type=Path, nargs="*")
    args = p.parse_args()
    return report(args.report, args.junit) if args.report else prebuild()


if __name__ == "__main__":
    sys.exit(main())
