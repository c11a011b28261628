from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from vm import VM, boot, build_image, wheelhouse

GUEST = Path(__file__).parent / "guest"
UNIT = Path(__file__).resolve().parents[2] / "units" / "nodeagent.service"


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VM]:
    """One booted guest for the lab session, with the agent installed the way a host gets
    it: a wheel into /opt/nodeagent/venv (--system-site-packages: the distro's pyverbs),
    the unit in /etc/systemd/system, soft-RoCE devices rxe0 on ens4 and rxe1 on ens5."""
    image = build_image()
    wheels = wheelhouse()
    vm = boot(image, tmp_path_factory.mktemp("lab"))
    try:
        vm.put(wheels, "/root/wheels")
        vm.put(GUEST, "/root/guest")
        vm.put(UNIT, "/etc/systemd/system/nodeagent.service")
        vm.ssh("python3 -m venv --system-site-packages /opt/nodeagent/venv && "
               "/opt/nodeagent/venv/bin/pip install -q --no-compile --no-index "
               "--find-links /root/wheels nodeagent", timeout=600)
        vm.ssh("systemctl daemon-reload")
        vm.ssh("rdma link add rxe0 type rxe netdev ens4 && rdma link add rxe1 type rxe "
               "netdev ens5")
        yield vm
    finally:
        vm.kill()


@pytest.fixture
def guest(lab: VM) -> Iterator[VM]:
    """The lab guest, rails reset before and after each test: agent stopped, QP holders
    gone, NetworkManager and networkd off the rails, carriers on, addresses flushed."""
    reset(lab)
    try:
        yield lab
    finally:
        reset(lab)


def reset(vm: VM) -> None:
    for rail in ("rail0", "rail1"):
        vm.set_link(rail, True)
    vm.ssh("systemctl stop nodeagent 2>/dev/null; systemctl reset-failed nodeagent "
           "2>/dev/null; pkill -f '/root/guest/[q]p_holder'; "
           "rm -f /etc/NetworkManager/system-connections/rail* "
           "/etc/NetworkManager/conf.d/20-rails.conf /etc/systemd/network/20-rail* "
           "/etc/systemd/networkd.conf.d/*.conf; nmcli connection reload; "
           "nmcli device set ens4 managed no; nmcli device set ens5 managed no; "
           "networkctl reload; "
           "for i in ens4 ens5; do ip addr flush dev $i; ip link set $i up; done; "
           "ip rule del priority 1000 2>/dev/null; ip rule del priority 1001 2>/dev/null; "
           "ip route flush table 100; ip route flush table 101; "
           "rm -rf /var/lib/nodeagent /run/nodeagent /etc/nodeagent; true")
