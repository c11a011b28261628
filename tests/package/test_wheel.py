"""The wheel alone: built from this checkout, installed into a clean venv without the
system's site packages (no python3-systemd, no pyverbs), it validates a config and runs
as the daemon under a real $NOTIFY_SOCKET listener, saying READY=1."""

from __future__ import annotations

import socket
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from typing import Any

from nodeagent import __version__
from tests.kit.helpers import Netns, stop_daemon, write_config
from tests.kit.vm import wheelhouse

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_alone_validates_runs_and_says_ready(
        tmp_path: Path, rails_ns: Netns, agent_config: dict[str, Any]) -> None:
    # The agent's wheel and its dependencies' (cached by pyproject hash: the lab installs
    # the same set), installed with no index: what is tested is exactly this set.
    wheels = wheelhouse(tmp_path / "wheels")
    wheel = next(wheels.glob("nodeagent-*.whl"))
    assert wheel.name.startswith(f"nodeagent-{__version__}-")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-index", "--find-links", str(wheels), str(wheel)],
                   check=True, capture_output=True, timeout=900)
    probe = subprocess.run([python, "-c", "import importlib.util as u; "
                            "print(u.find_spec('systemd'), u.find_spec('pyverbs'))"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["None", "None"], "the venv must not see the distro's"
    out = subprocess.run([str(env_dir / "bin" / "nodeagent"), "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"nodeagent {__version__}"

    agent_config["gid_source"] = "auto"  # no pyverbs here: the sysfs reader, and it says so
    config = write_config(tmp_path / "c.yaml", agent_config)
    res = subprocess.run([str(env_dir / "bin" / "nodeagent"), "check", "--config-only",
                          "--config", str(config)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr

    sock_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(sock_path))
        sock.settimeout(60)
        log_path = tmp_path / "daemon.log"
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", rails_ns.name, python, "-m", "nodeagent", "run",
                 "--config", str(config)],
                env={"NOTIFY_SOCKET": str(sock_path), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                stdout=log_file, stderr=subprocess.STDOUT, text=True)
        proc.log_path = log_path  # type: ignore[attr-defined]
        try:
            ready = ""
            while "READY=1" not in ready:
                ready = sock.recv(4096).decode()
            assert "STATUS=fabric ready: 2 rail(s)" in ready, ready
        finally:
            code, log = stop_daemon(proc)
    assert code == 0 and "Traceback" not in log, log
    assert "sd_notify over $NOTIFY_SOCKET directly" in log


def test_sdist_and_wheel_build_and_pass_twine_check(tmp_path: Path) -> None:
    """What a release uploads: `python -m build` makes the sdist, then the wheel from the
    sdist (so the sdist is complete), and `twine check --strict` accepts both (metadata,
    README rendering on the index)."""
    dist = tmp_path / "dist"
    res = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (sdist,) = dist.glob(f"nodeagent-{__version__}.tar.gz")
    (wheel,) = dist.glob(f"nodeagent-{__version__}-py3-none-any.whl")
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(sdist),
                            str(wheel)], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("PASSED") == 2, check.stdout
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert any(n.startswith("nodeagent/cli/manifests/") and n.endswith(".yaml")
               for n in names), "the templates `nodeagent deploy` renders"
    assert not any(n.startswith(("tests/", "tools/", "bench/")) for n in names), \
        "only the agent ships"
    print(f"\nsdist {sdist.stat().st_size / 1e3:.0f} kB, wheel {wheel.stat().st_size / 1e3:.0f}"
          f" kB ({len(names)} files)")
