"""`nodeagent preflight`'s judgement and its gang barrier: NCCL's predicted choice joined
to the device and verdict checks, and the barrier over
real loopback sockets (a pod missing, one answering garbage, one answering as another
rank). The checks inside a real container are in tests/kubelet; the gang's RoCE probe
between two kernels in tests/lab/test_peers.py."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from nodeagent.checks.preflight import (
    PreflightFacts,
    class_notes,
    device_problems,
    judge_preflight,
)
from nodeagent.cli.gang import (
    CARD_MAX,
    CardServer,
    GangCard,
    barrier,
    fetch_card,
    probe_again_once_failed,
    run_gang,
)
from nodeagent.cli.preflight import nccl_environment, peer_names, report, verdict_from_status
from nodeagent.model.jobs import (
    AllocatedDevice,
    GidSlot,
    NodeRail,
    NodeVerdict,
    PodAllocation,
    PortView,
    VerbsDevice,
)
from nodeagent.model.kube import DeviceRef
from nodeagent.model.peers import PeerOutcome, PeerProbe
from nodeagent.probes.container import read_verbs_devices
from tests.kit.helpers import free_port, wait_for

RAILS = (NodeRail("rail0", "10.10.0.5", "mlx5_0", 1, 3),
         NodeRail("rail1", "10.11.0.5", "mlx5_1", 1, 3))
READY = NodeVerdict("gpu-05", True, "AllConditionsPassed", "ok", RAILS)
DEVICES = (VerbsDevice("uverbs0", "mlx5_0", True), VerbsDevice("uverbs1", "mlx5_1", True))


def standard_port(device: str, ipv4: str) -> PortView:
    """The 4-entry mlx5 table (NVIDIA/nccl-tests#192): fe80 v1/v2, the IPv4 pair at 2/3."""
    def slot(i: int, gid: str, version: int) -> GidSlot:
        return GidSlot(i, ipaddress.IPv6Address(gid), version)
    return PortView(device, 1, True, True, (
        slot(0, "fe80::1", 1), slot(1, "fe80::1", 2), slot(2, f"::ffff:{ipv4}", 1),
        slot(3, f"::ffff:{ipv4}", 2)), "ACTIVE")


PORTS = (standard_port("mlx5_0", "10.10.0.5"), standard_port("mlx5_1", "10.11.0.5"))


def facts(verdict: NodeVerdict = READY, env: dict[str, str] | None = None,
          allow_partial: bool = False) -> PreflightFacts:
    return PreflightFacts(verdict, DEVICES, env or {}, ports=PORTS,
                          allow_partial=allow_partial)


def test_a_fit_pod_has_no_problem_and_says_what_nccl_will_use() -> None:
    fit = facts(env={"NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "mlx5"})
    assert judge_preflight(fit) == []
    assert fit.plan().summary() == "NCCL: IB on mlx5_0:1 GID 3, mlx5_1:1 GID 3; TC 0, SL 0"


def test_nccl_problems_join_the_others() -> None:
    """The environment is judged by NCCL's predicted choice (tests/unit/test_nccl_prediction
    has the cases); here, that its lines reach the preflight's, and the allow flag."""
    partial = facts(env={"NCCL_IB_HCA": "=mlx5_0"})
    assert [u.line() for u in judge_preflight(partial)] == [
        "nccl: NCCL would use 1 of 2 rails, not rail1 (mlx5_1:1) (mlx5_1:1 is not in "
        "NCCL_IB_HCA==mlx5_0): the job trains at a fraction of the bandwidth; select every "
        "rail, or pass --allow-partial-rails"]
    assert judge_preflight(facts(env={"NCCL_IB_HCA": "=mlx5_0"}, allow_partial=True)) == []
    assert [u.line() for u in judge_preflight(PreflightFacts(READY, DEVICES, {}))] == [
        "nccl: NCCL would use TCP sockets, not the rails: no ACTIVE RDMA port here: NCCL "
        "falls back to TCP sockets without an error; request the RDMA resource"]


def test_nccl_conf_files_fill_the_environment(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "nccl.conf").write_text("NCCL_IB_DISABLE=1\nNCCL_IB_HCA=mlx5\n")
    (tmp_path / "job.conf").write_text("NCCL_IB_HCA=mlx5_0\n")
    got = nccl_environment({"NCCL_CONF_FILE": "/job.conf", "NCCL_IB_DISABLE": "0"}, tmp_path)
    assert got == {"NCCL_CONF_FILE": "/job.conf", "NCCL_IB_DISABLE": "0",
                   "NCCL_IB_HCA": "mlx5_0"}
    assert nccl_environment({"HOME": "/nowhere"}, tmp_path)["NCCL_IB_DISABLE"] == "1"


def test_no_device_names_the_resource_to_request() -> None:
    got = device_problems([], RAILS, "rdma/rdma_shared_device_a")
    assert [u.line() for u in got] == ["devices: no RDMA device in this container: request "
                                       "rdma/rdma_shared_device_a in resources.limits"]
    denied = [VerbsDevice("uverbs0", "mlx5_0", False, "/dev/infiniband/uverbs0: the "
                          "container may not open it (device cgroup)")]
    assert "(/dev/infiniband/uverbs0: the container may not open it (device cgroup))" in \
        device_problems(denied, RAILS, "r")[0].message
    one = device_problems(DEVICES[:1], RAILS, "r")
    assert one[0].message.startswith("the rails' RDMA devices not in this container: "
                                     "mlx5_1 (rail1)")


def test_a_node_that_is_not_ready_or_unknown_refuses() -> None:
    bad = NodeVerdict("gpu-05", False, "RuleMissing", "rail0 ens1f0: rule missing", RAILS)
    got = judge_preflight(facts(bad))
    assert [u.line() for u in got] == ["node: node gpu-05 is not fabric-ready: FabricReady "
                                       "(RuleMissing): rail0 ens1f0: rule missing"]
    unknown = judge_preflight(facts(NodeVerdict(problem="no agent status")))
    assert unknown[0].line() == ("node: cannot tell whether this node's fabric is ready: no "
                                 "agent status")


def test_uverbs_nodes_are_read_with_their_device(tmp_path: Path) -> None:
    """A fixture tree of uverbs_main.c's shape: /dev/infiniband/uverbsN (a character
    device, here /dev/null's numbers), /sys/class/infiniband_verbs/uverbsN/ibdev."""
    dev, sysfs = tmp_path / "dev", tmp_path / "sys"
    (dev / "infiniband").mkdir(parents=True)
    os.mknod(dev / "infiniband" / "uverbs0", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (dev / "infiniband" / "uverbs1").write_text("")  # not a device
    for n, name in (("uverbs0", "mlx5_0"), ("uverbs1", "mlx5_1")):
        (sysfs / "class" / "infiniband_verbs" / n).mkdir(parents=True)
        (sysfs / "class" / "infiniband_verbs" / n / "ibdev").write_text(name + "\n")
    got = read_verbs_devices(dev, sysfs)
    assert got[0] == VerbsDevice("uverbs0", "mlx5_0", True)
    assert got[1].ibdev == "mlx5_1" and not got[1].usable
    assert "is not a character device" in got[1].why
    assert read_verbs_devices(tmp_path / "nothing", sysfs) == []


def test_peers_by_list_or_pattern() -> None:
    assert peer_names("a, b,c", 0) == ["a", "b", "c"]
    assert peer_names("train-{index}.train", 3) == ["train-0.train", "train-1.train",
                                                    "train-2.train"]
    for spec, size in (("train-{index}.train", 0), ("a,b", 3)):
        with pytest.raises(ValueError):
            peer_names(spec, size)


def test_the_termination_message_holds_the_lines_bounded(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    from nodeagent.model.jobs import Unfit

    log = tmp_path / "termination-log"
    report([Unfit("env", "NCCL_NET=Socket forces sockets"), Unfit("gang", "x\x1b[31m" * 2000)],
           log)
    text = log.read_text()
    assert text.startswith("preflight: env: NCCL_NET=Socket forces sockets\npreflight: gang:")
    assert len(log.read_bytes()) == 4096 and "\x1b" not in text
    assert "preflight: env: NCCL_NET=Socket" in capsys.readouterr().err
    report([], log)
    assert log.read_text() == "preflight: fit\n"


@pytest.mark.parametrize("kind", ["symlink", "fifo", "fifo-read"])
def test_the_termination_message_goes_to_a_regular_file_only(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A symlinked --termination-log was written through (to any file the pod may write),
    and a FIFO hung the preflight (an open for writing waits for a reader)."""
    log = tmp_path / "termination-log"
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    reader = None
    if kind == "symlink":
        log.symlink_to(target)
    else:
        os.mkfifo(log)
        if kind == "fifo-read":  # a reader there: the open succeeds, the type refuses it
            reader = os.open(log, os.O_RDONLY | os.O_NONBLOCK)
    try:
        done = threading.Event()
        worker = threading.Thread(target=lambda: (report([], log), done.set()), daemon=True)
        worker.start()
        worker.join(10)
        assert done.is_set(), "the report hung"
    finally:
        if reader is not None:
            os.close(reader)
    why = "it is a symbolic link" if kind == "symlink" else "not a regular file"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"preflight: cannot write {log}: {why}")
    assert target.read_text() == "keep\n"


def test_no_status_file_fails_closed_with_what_to_mount(tmp_path: Path) -> None:
    got = verdict_from_status(tmp_path)
    assert got.problem is not None and "mount the host's" in got.problem
    (tmp_path / "status.json").write_text("{not json")
    assert "status.json" in (verdict_from_status(tmp_path).problem or "")


# ---------------------------------------------------------------- the barrier


def card(i: int) -> GangCard:
    return GangCard(i, f"gpu-{i}", (NodeRail("rail0", f"10.10.0.{i + 1}"),))



def test_a_card_reads_back_and_garbage_is_named() -> None:
    port = free_port()
    server = CardServer(card(1), port, "127.0.0.2")
    server.start()
    try:
        assert fetch_card("127.0.0.2", port, 0) == card(1)
        assert server.fetched_by == {0}
        with socket.create_connection(("127.0.0.2", port)) as s:  # no rank: a card, no count
            s.sendall(b"\xff\n")
            assert s.recv(CARD_MAX) == card(1).encode()
        assert server.fetched_by == {0}
    finally:
        server.stop()
    for data, words in ((b"\xff\xfe", "not a card"), (b"[]", "index, node or rails missing"),
                        (b'{"index":1,"node":"x","rails":[{"name":"r","address":"10.x"}]}',
                         "address"), (b"x" * (CARD_MAX + 1), "more than 4096 bytes")):
        with pytest.raises(ValueError, match=words):
            from nodeagent.cli.gang import parse_card

            parse_card(data)


def serve_garbage(host: str, port: int, stop: threading.Event) -> None:
    with socket.create_server((host, port)) as s:
        s.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = s.accept()
            except TimeoutError:
                continue
            with conn:  # reads the rank line (no reset on close), answers a web page
                conn.recv(16)
                conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n<html>")


def test_the_barrier_waits_for_every_pod_and_names_the_ones_that_never_came() -> None:
    port = free_port()
    peers = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    servers = [CardServer(card(1), port, "127.0.0.2"), CardServer(card(3), port, "127.0.0.4")]
    stop = threading.Event()
    garbage = threading.Thread(target=serve_garbage, args=("127.0.0.3", port, stop))
    for s in servers:
        s.start()
    garbage.start()
    try:
        started = time.monotonic()
        cards, problems = barrier(peers, 0, port, time.monotonic() + 1.5)
        assert time.monotonic() - started < 10  # bounded (a hang guard, not a figure)
        assert set(cards) == {1, 3}
        assert [u.line() for u in problems] == [
            "gang: barrier: 1 of 3 other pods not ready by the deadline: 127.0.0.3 (not a "
            "card: b'HTTP/1.1 200 OK\\r\\n\\r\\n<html>')"]
        _, wrong = barrier(["127.0.0.1", "127.0.0.4"], 0, port, time.monotonic() + 0.5)
        assert "127.0.0.4 (answered as pod 3, not 1)" in wrong[0].message
        _, absent = barrier(["127.0.0.1", "127.0.0.9"], 0, port, time.monotonic() + 0.5)
        assert "127.0.0.9 (connection refused)" in absent[0].message
        _, unresolved = barrier(["127.0.0.1", "no-such-pod.invalid"], 0, port,
                                time.monotonic() + 0.5)
        assert "no-such-pod.invalid (name not resolved" in unresolved[0].message
    finally:
        stop.set()
        for s in servers:
            s.stop()
        garbage.join()


def test_a_gang_of_two_meets_then_probes_and_says_why_a_probe_could_not_run() -> None:
    """Two pods on loopback run the whole gang step; no rail of theirs says where its GID
    is (no agent status), so each probe is refused locally, named with its pair."""
    port, probe_port = free_port(), free_port()
    peers = ["127.0.0.1", "127.0.0.2"]
    results: dict[int, list[str]] = {}

    def pod(i: int) -> None:
        _, problems = run_gang(card(i), peers, port, probe_port, time.monotonic() + 5, 1.0,
                               bind=peers[i])
        results[i] = [u.line() for u in problems]

    threads = [threading.Thread(target=pod, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results[0] == ["gang: gpu-0 10.10.0.1 -> gpu-1 10.10.0.2 on rail0: this pod "
                          "cannot probe (the node's agent does not say where this rail's "
                          "GID is)"]
    assert results[1][0].startswith("gang: gpu-1 10.10.0.2 -> gpu-0 10.10.0.1 on rail0")


@pytest.mark.parametrize("outcomes, want, made", [
    ((PeerOutcome.ROCE_FAILED, PeerOutcome.OK), PeerOutcome.OK, 2),
    ((PeerOutcome.MTU_FAILED, PeerOutcome.MTU_FAILED), PeerOutcome.MTU_FAILED, 2),
    ((PeerOutcome.ROCE_FAILED, PeerOutcome.ROCE_FAILED, PeerOutcome.OK),
     PeerOutcome.ROCE_FAILED, 2),
    ((PeerOutcome.OK,), PeerOutcome.OK, 1),
    ((PeerOutcome.NO_RESPONDER, PeerOutcome.OK), PeerOutcome.NO_RESPONDER, 1),
    ((PeerOutcome.LOCAL, PeerOutcome.OK), PeerOutcome.LOCAL, 1)])
def test_a_ring_probe_failing_over_roce_is_made_once_more(
        outcomes: tuple[PeerOutcome, ...], want: PeerOutcome, made: int) -> None:
    """Lab 4g: a healthy peer in a starved guest missed one probe's RC retries and the
    gang was refused; a RoCE failure is probed again once (as the daemon needs two failed
    probes in a row), anything else is the answer at once."""
    left = list(outcomes)

    def probe() -> PeerProbe:
        return PeerProbe("rail0", "10.10.0.2", "gpu-1", left.pop(0))
    assert probe_again_once_failed(probe).outcome == want
    assert len(outcomes) - len(left) == made


def test_a_gang_of_three_on_one_address_ends_when_done_not_at_its_deadline() -> None:
    """Three pods whose fetches all come from 127.0.0.1 (pods on one host's network): each
    knows the others have its card by their ranks, so all end long before the 120 s
    deadline (the join is a hang guard: counting source addresses waited it out)."""
    port, probe_port = free_port(), free_port()
    peers = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    gang = [GangCard(i, f"gpu-{i}", ()) for i in range(3)]  # no rails: nothing to probe
    results: dict[int, list[str]] = {}

    def pod(i: int) -> None:
        _, problems = run_gang(gang[i], peers, port, probe_port, time.monotonic() + 120, 1.0,
                               bind=peers[i])
        results[i] = [u.line() for u in problems]

    threads = [threading.Thread(target=pod, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a pod waited for its deadline"
    assert results == {0: [], 1: [], 2: []}


def test_a_pod_stays_until_the_previous_one_has_seen_it_ready() -> None:
    """A gang of two with no rails to probe (an agent that says no GID): pod 0, played by
    hand, fetches pod 1's card before serving its own (so pod 1 cannot be ready yet), then
    looks for pod 1's ready card a second after pod 1 has its. Pod 1 must still be there to
    say it (bench/preflight.py's 8 pods on 2 cores hit it: pod 1 had ended, "its responder
    was not up by the deadline (connection refused)"), and must stay until pod 0 says it
    is done with it (pod 0 may probe it a second time)."""
    port, probe_port = free_port(), free_port()
    peers = ["127.0.0.1", "127.0.0.2"]
    results: list[list[str]] = []

    def fast() -> None:
        _, problems = run_gang(GangCard(1, "gpu-1", ()), peers, port, probe_port,
                               time.monotonic() + 30, 1.0, bind=peers[1])
        results.append([u.line() for u in problems])

    def barrier_fetch() -> GangCard | None:
        try:
            return fetch_card(peers[1], port, 0)
        except OSError:  # pod 1 not serving yet
            return None
    pod1 = threading.Thread(target=fast, daemon=True)
    pod1.start()
    assert not wait_for(barrier_fetch, 10, "pod 1's card at the barrier").ready
    slow = CardServer(GangCard(0, "gpu-0", (), ready=True), port, bind=peers[0])
    slow.start()
    try:
        wait_for(lambda: 1 in slow.fetched_by, 10, "pod 1 fetching pod 0's card")
        time.sleep(1.0)
        assert fetch_card(peers[1], port, 0).ready
        time.sleep(1.0)
        assert pod1.is_alive(), "pod 1 left before pod 0 was done with it"
        fetch_card(peers[1], port, 0, done=True)
        pod1.join(10)
        assert not pod1.is_alive() and results == [[]]
    finally:
        slow.stop()


@pytest.mark.parametrize("data", [b"", b"\n", b"{}", b"null", b'{"index": true, "node": "x", '
                                  b'"rails": []}', b'{"index": 1, "node": 7, "rails": []}',
                                  b'{"index": 1, "node": "x", "rails": [7]}',
                                  # 4 KiB of nesting: RecursionError, a preflight traceback
                                  b"[" * 2000 + b"]" * 2000])
def test_a_peer_card_of_any_other_shape_is_refused_in_words(data: bytes) -> None:
    from nodeagent.cli.gang import parse_card

    with pytest.raises(ValueError, match="not a card"):
        parse_card(data)


def test_any_bytes_at_the_barrier_are_a_card_or_a_value_error() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from nodeagent.cli.gang import parse_card

    @given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
    @settings(max_examples=300, deadline=None)
    def check(data: bytes) -> None:
        try:
            got = parse_card(data)
        except ValueError:
            return
        assert isinstance(got, GangCard)

    check()


def test_a_barrier_port_already_taken_is_one_line_not_a_traceback() -> None:
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        _, problems = run_gang(card(0), ["127.0.0.1", "127.0.0.2"], port, free_port(),
                               time.monotonic() + 5, 1.0, bind="127.0.0.1")
    assert [u.line() for u in problems] == [
        f"gang: cannot serve the barrier on 127.0.0.1:{port}: address already in use "
        "(another gang's preflight on this node? give each job its own --gang-port)"]


@pytest.mark.parametrize("field", ["rails", "lustre"])
@pytest.mark.parametrize("value", [7, None, {"name": "rail0"}, "rail0"])
def test_a_status_file_whose_lists_are_not_lists_is_read_not_a_traceback(
        tmp_path: Path, field: str, value: object) -> None:
    """status.json with `rails` or `lustre` an int, null, a mapping or a string raised
    TypeError in preflight (`nodeagent status` read the same file)."""
    doc = {"node": "gpu-05", "ok": True, "actions": [], "errors": [],
           "conditions": [{"type": "FabricReady", "status": "True",
                           "reason": "AllConditionsPassed", "message": "ok"}],
           "daemon": {"updated_at": time.time(), "resync_interval": 30}, field: value}
    (tmp_path / "status.json").write_text(json.dumps(doc))
    got = verdict_from_status(tmp_path)
    assert got.node == "gpu-05" and got.rails == () and got.lustre == ()


@pytest.mark.parametrize("every", [1e300, 1e9, -5, True, "30"])
def test_a_forged_resync_interval_does_not_keep_a_year_old_status_fresh(
        tmp_path: Path, every: object) -> None:
    """A status file saying resync_interval 1e300, a year old, passed preflight while
    `nodeagent status` called it stale: one rule for both (publish/status.py
    stale_after), a value no config could hold counting as the default."""
    from nodeagent.publish.status import DaemonLock

    doc = {"node": "gpu-05", "ok": True, "actions": [], "errors": [],
           "conditions": [{"type": "FabricReady", "status": "True",
                           "reason": "AllConditionsPassed", "message": "ok"}],
           "daemon": {"updated_at": time.time() - 365 * 86400, "resync_interval": every,
                      "pid": os.getpid()}}
    (tmp_path / "status.json").write_text(json.dumps(doc))
    lock = DaemonLock(tmp_path)
    lock.acquire()  # a daemon holds the runtime dir: the file is its, and wedged
    try:
        got = verdict_from_status(tmp_path)
    finally:
        lock.release()
    assert got.problem is not None and "status is stale" in got.problem, got


def test_any_status_file_gives_preflight_a_verdict_or_a_problem_never_an_exception() -> None:
    """The status file is the host agent's, mounted read-only into a pod: a forged or broken
    one gives a verdict or a problem line (generated JSON of any shape, and raw bytes)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    values = st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
        | st.text(max_size=12),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8),
                                                                    inner, max_size=4),
        max_leaves=15)
    docs = st.fixed_dictionaries({}, optional={
        "node": values, "ok": values, "rails": values, "lustre": values, "errors": values,
        "conditions": st.lists(st.fixed_dictionaries({}, optional={
            "type": st.sampled_from(["FabricReady"]) | values, "status": values,
            "reason": values, "message": values}) | values, max_size=3) | values,
        "daemon": st.fixed_dictionaries({}, optional={
            "pid": values, "updated_at": values, "resync_interval": values}) | values})

    @given(docs.map(lambda d: json.dumps(d).encode()) | st.binary(max_size=300))
    @settings(max_examples=200, deadline=None)
    def check(data: bytes) -> None:
        import tempfile

        with tempfile.TemporaryDirectory() as run:
            Path(run, "status.json").write_bytes(data)
            got = verdict_from_status(Path(run))
        assert isinstance(got, NodeVerdict)
        assert got.problem is None or "\n" not in got.problem

    check()


# ---------------------------------------------------------------- --claims (DRA)

def nic_device(name: str, rdma_device: str, ifname: str, root: str, numa: int,
               rdma: bool = True) -> AllocatedDevice:
    """An allocated NIC with dranet's attributes (its published slices: ifName, rdma,
    rdmaDevice, numaNode; the standard pcieRoot)."""
    return AllocatedDevice("ml/train-0-nic", DeviceRef("dra.net", "gpu-05", name), {
        "dra.net/ifName": ifname, "dra.net/rdma": rdma, "dra.net/rdmaDevice": rdma_device,
        "dra.net/numaNode": numa, "resource.kubernetes.io/pcieRoot": root})


def gpu_device(name: str, root: str | None = None, numa: int | None = None) -> AllocatedDevice:
    attributes: dict[str, str | int | bool] = {"gpu.nvidia.com/productName": "H100"}
    if root is not None:
        attributes["resource.kubernetes.io/pcieRoot"] = root
    if numa is not None:
        attributes["resource.kubernetes.io/numaNode"] = numa
    return AllocatedDevice("ml/train-0-gpu", DeviceRef("gpu.nvidia.com", "gpu-05", name),
                           attributes)


def claimed(*devices: AllocatedDevice, interfaces: tuple[str, ...] = ("eth0", "r1"),
            env: dict[str, str] | None = None, **kw: bool) -> PreflightFacts:
    """A pod that sees rail1's device alone (dranet's exclusive RDMA mode)."""
    return PreflightFacts(READY, DEVICES[1:], env or {"NCCL_IB_GID_INDEX": "3"},
                          ports=PORTS[1:], interfaces=interfaces,
                          allocation=PodAllocation(devices), **kw)


NIC1 = nic_device("pci-r1", "mlx5_1", "r1", "pci0000:1b", 1)


def test_a_pod_holding_one_nic_is_judged_on_that_rail_alone_and_fits_beside_its_gpu() -> None:
    """A DRA pod gets some NICs, not the node's every rail: rail0 not used is no problem."""
    fit = claimed(NIC1, gpu_device("gpu-1", root="pci0000:1b"))
    assert [r.name for r in fit.rails()] == ["rail1"]
    assert judge_preflight(fit) == []


def test_a_gpu_on_another_pcie_root_or_numa_node_than_its_nics_is_refused() -> None:
    far = claimed(NIC1, gpu_device("gpu-0", root="pci0000:0a"))
    assert [u.line() for u in judge_preflight(far)] == [
        "alignment: GPU gpu-0 of claim ml/train-0-gpu is on PCIe root pci0000:0a, its NICs on "
        "pci0000:1b: every transfer crosses the CPU interconnect (about half the all-reduce "
        "bandwidth); constrain the claim with matchAttribute resource.kubernetes.io/pcieRoot,"
        " or pass --allow-unaligned"]
    assert judge_preflight(claimed(NIC1, gpu_device("gpu-0", root="pci0000:0a"),
                                   allow_unaligned=True)) == []
    # No PCIe root on the GPU: the NUMA node (standard on the GPU, dranet's on the NIC).
    numa = judge_preflight(claimed(NIC1, gpu_device("gpu-0", numa=0)))
    assert [u.check for u in numa] == ["alignment"] and "NUMA node 0" in numa[0].message
    assert judge_preflight(claimed(NIC1, gpu_device("gpu-1", numa=1))) == []
    assert judge_preflight(claimed(NIC1, gpu_device("gpu-0"))) == []  # unknown: not judged


def test_an_allocated_nic_missing_from_the_container_or_without_rdma_is_refused() -> None:
    gone = judge_preflight(claimed(NIC1, interfaces=("eth0",)))
    assert [u.line() for u in gone] == [
        "claims: NIC pci-r1 of claim ml/train-0-nic (r1) is not in this container: the "
        "driver did not move it into the pod (is the driver running on this node?)"]
    no_rdma = judge_preflight(claimed(nic_device("pci-r1", "mlx5_1", "r1", "x", 1,
                                                 rdma=False)))
    assert [u.check for u in no_rdma] == ["claims"]
    assert "published without RDMA" in no_rdma[0].message
    other = nic_device("pci-r2", "mlx5_2", "r1", "pci0000:1b", 1)  # mlx5_2: not in here
    lines = [u.line() for u in judge_preflight(claimed(other))]
    assert "claims: NIC pci-r2 of claim ml/train-0-nic's RDMA device mlx5_2 is not in this " \
           "container" in lines[0], lines
    unlisted = AllocatedDevice("ml/c", DeviceRef("dra.net", "gpu-05", "pci-x"))
    assert [u.line() for u in judge_preflight(claimed(unlisted))] == [
        "claims: NIC pci-x of claim ml/c is not in this node's ResourceSlices"]


def test_nccl_not_opening_the_allocated_nic_or_no_nic_at_all_is_refused() -> None:
    skipped = judge_preflight(PreflightFacts(
        READY, DEVICES, {"NCCL_IB_HCA": "=mlx5_0", "NCCL_IB_GID_INDEX": "3"}, ports=PORTS,
        interfaces=("r1",), allocation=PodAllocation((NIC1,))))
    # A NIC the pod was not allocated, seen in it (shared mode) is no rail of its own.
    shared = PreflightFacts(READY, DEVICES, {"NCCL_IB_GID_INDEX": "3"}, ports=PORTS,
                            interfaces=("r1",), allocation=PodAllocation((NIC1,)))
    assert [u.line() for u in judge_preflight(shared)] == [
        "nccl: NCCL would also use mlx5_0:1, not a rail: its traffic leaves the fabric; set "
        "NCCL_IB_HCA==mlx5_1"]
    assert "claims: NCCL would not use NIC pci-r1 of claim ml/train-0-nic (mlx5_1: mlx5_1:1 " \
           "is not in NCCL_IB_HCA==mlx5_0): set NCCL_IB_HCA to include it" in \
           [u.line() for u in skipped], skipped
    gpus_only = judge_preflight(claimed(gpu_device("gpu-0", root="pci0000:0a")))
    assert gpus_only[0].line() == (
        "claims: this pod's claims hold no NIC of dra.net (they hold: gpu.nvidia.com): its "
        "traffic would leave the fabric; add a request for an RDMA NIC to the claim")
    unread = PreflightFacts(READY, DEVICES, {}, ports=PORTS,
                            allocation=PodAllocation(problem="403 Forbidden"))
    assert "claims: cannot read this pod's ResourceClaims: 403 Forbidden" in \
           [u.line() for u in judge_preflight(unread)]


# ---------------------------------------------------------------- the job's traffic class

def classed_rails(classes: dict[int, tuple[int, int]]) -> tuple[NodeRail, ...]:
    return tuple(NodeRail(r.name, r.address, r.device, r.port, r.gid_index, classes)
                 for r in RAILS)


def test_the_jobs_class_failing_on_the_nodes_peers_is_refused_whatever_class_0_says() -> None:
    """The node's agent probes peers in 0 and 104; the job runs in NCCL_IB_TC=104, where the
    path drops RoCE to 3 of 4 peers (class 0 clean): the job would crawl, so it is refused.
    The same job in class 0 fits."""
    verdict = NodeVerdict("gpu-05", True, "AllConditionsPassed", "ok",
                          classed_rails({0: (0, 4), 104: (3, 4)}))
    env = {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_TC": "104"}
    lines = [u.line() for u in judge_preflight(PreflightFacts(verdict, DEVICES, env,
                                                              ports=PORTS))]
    assert lines == [
        f"peers: {r}: 3 of 4 peers fail over RoCE in class 104 (DSCP 26), this job's "
        "(NCCL_IB_TC=104), while TCP reaches them: the path drops the job's class; see the "
        "node's RDMAPeersReachable, or run where it passes" for r in ("rail0", "rail1")]
    env["NCCL_IB_TC"] = "0"
    assert judge_preflight(PreflightFacts(verdict, DEVICES, env, ports=PORTS)) == []


def test_a_class_the_agent_does_not_probe_is_named_in_the_fit_line_not_refused() -> None:
    verdict = NodeVerdict("gpu-05", True, "AllConditionsPassed", "ok",
                          classed_rails({0: (0, 4)}))
    fit = PreflightFacts(verdict, DEVICES, {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_TC": "106"},
                         ports=PORTS)
    assert judge_preflight(fit) == []
    assert class_notes(fit) == ["class 106 not probed on rail0, rail1 (the agent probes 0: "
                                "add 106 to peers.classes)"]
    assert class_notes(facts(env={"NCCL_IB_GID_INDEX": "3"})) == []  # no peer probes known


def test_the_status_files_peers_give_each_rails_classes(tmp_path: Path) -> None:
    """The classes as the status file writes them (rails[].peers[], PeerStats.as_dict): a
    peer failing over RoCE counts, a peer with no responder (a dead node) does not."""
    def peer(tc: int, outcome: str, failing: bool) -> dict[str, object]:
        return {"address": "10.10.0.7", "outcome": outcome, "failing": failing,
                "traffic_class": tc}

    doc = {"node": "gpu-05", "ok": True, "actions": [], "errors": [],
           "conditions": [{"type": "FabricReady", "status": "True",
                           "reason": "AllConditionsPassed", "message": "ok"}],
           "daemon": {"updated_at": time.time(), "resync_interval": 30},
           "rails": [{"name": "rail0", "address": "10.10.0.5", "rdma_device": "mlx5_0",
                      "rdma_port": 1, "gid_index_pinned": 3, "peers": [
                          peer(0, "ok", False), peer(104, "RoCE failed", True),
                          peer(104, "no responder", True), peer(104, "MTU failed", False),
                          peer(999, "ok", False), "junk", peer(True, "ok", False)]}]}
    (tmp_path / "status.json").write_text(json.dumps(doc))
    got = verdict_from_status(tmp_path)
    assert got.rails[0].classes == {0: (0, 1), 104: (1, 3)}
