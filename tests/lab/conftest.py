from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.kit.labkit import GUEST, ensure_agent
from tests.kit.vm import VM, boot, build_image, wheelhouse

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The role's test first: it installs the agent on the fresh guest the way a host gets
    it, and leaves it installed for the scenarios (saving a second install)."""
    role = [i for i in items if i.path.name == "test_role.py"]
    if role:
        first_lab = next(n for n, i in enumerate(items) if i.path.parent == HERE)
        rest = [i for i in items if i not in role]
        items[:] = rest[:first_lab] + role + rest[first_lab:]


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's wheel and its dependencies', for pip --no-index in a guest."""
    return wheelhouse(tmp_path_factory.mktemp("wheels"))


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Iterator[VM]:
    """One booted guest for the lab session: the agent's wheelhouse in /root/wheels, soft-RoCE
    devices rxe0 on ens4 and rxe1 on ens5. The agent itself is installed by the role's test
    (or by `guest` when that test did not run)."""
    image = build_image()
    vm = boot(image, tmp_path_factory.mktemp("lab"))
    try:
        vm.put(wheels, "/root/wheels")
        vm.put(GUEST, "/root/guest")
        vm.ssh("rdma link add rxe0 type rxe netdev ens4 && rdma link add rxe1 type rxe "
               "netdev ens5")
        yield vm
    finally:
        vm.kill()


@pytest.fixture(scope="session")
def peer_node(lab: VM, wheels: Path, tmp_path_factory: pytest.TempPathFactory,
              ) -> Iterator[Future[VM]]:
    """The peer node of the two-node cases (tests/lab/test_peers.py), booted on the lab
    guest's fab0 wire in the background, its agent installed the way a host gets it: its
    boot and install (3.5 min under emulation) overlap the tests run before those cases
    (in CI, the role's test)."""
    workdir = tmp_path_factory.mktemp("node-b")

    def start() -> VM:
        vm = boot(build_image(), workdir, peer_of=lab.fab_port)
        try:
            vm.ssh("hostnamectl set-hostname lab-b")
            vm.put(wheels, "/root/wheels")
            vm.put(GUEST, "/root/guest")
            ensure_agent(vm)
            vm.ssh("rdma link add rxe0 type rxe netdev ens4")
        except BaseException:
            vm.kill()
            raise
        return vm

    with ThreadPoolExecutor(max_workers=1) as pool:
        booting = pool.submit(start)
        try:
            yield booting
        finally:
            # A boot still under way is waited for, then killed: no guest outlives the lab.
            if booting.exception() is None:
                booting.result().kill()


@pytest.fixture(scope="session", autouse=True)
def peer_node_early(request: pytest.FixtureRequest) -> None:
    """Start the peer node's boot at the session's first test when a two-node case will
    run (an autouse fixture, so that it starts before those cases ask for it)."""
    if any(item.path.name == "test_peers.py" for item in request.session.items):
        request.getfixturevalue("peer_node")


@pytest.fixture
def guest(lab: VM) -> Iterator[VM]:
    """The lab guest, rails reset before and after each test: agent stopped, QP holders
    gone, NetworkManager and networkd off the rails, carriers on, addresses flushed."""
    ensure_agent(lab)
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
           "pkill -f '/root/guest/[g]id_watch'; pkill -f '/root/guest/[u]dp_blast'; "
           "pkill -f '[b]usy-guest'; "
           "pkill ibv_rc_pingpong; ip neigh flush dev ens4; "
           "rm -f /etc/NetworkManager/system-connections/rail* "
           "/etc/NetworkManager/conf.d/20-rails.conf /etc/systemd/network/20-rail* "
           "/etc/NetworkManager/conf.d/90-nodeagent-rails.conf "
           "/etc/systemd/network/05-nodeagent-rails.network "
           "/etc/systemd/networkd.conf.d/*.conf; nmcli connection reload; "
           "nmcli device set ens4 managed no; nmcli device set ens5 managed no; "
           "networkctl reload; "
           "for i in ens4 ens5; do ip addr flush dev $i; ip link set $i up; done; "
           "ip rule del priority 1000 2>/dev/null; ip rule del priority 1001 2>/dev/null; "
           "ip route flush table 100; ip route flush table 101; "
           "rm -rf /var/lib/nodeagent /run/nodeagent /etc/nodeagent; true")
