"""NodeBook, Need and Node without Ray: policies, blocking, CannotPlace, avoid, cancel, inventory changes."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.control.placement import ACCEL_LABEL, Cancelled, CannotPlace, Need, Node, NodeBook

# No test here is bounded by how fast the machine is. A waiter is woken by a release or a cancel, or
# by the refresh: with the refresh an hour (NEVER_S), only the event can have woken it, and HANG_S
# only catches a hang (a broken wake-up fails there instead of waiting the hour).
NEVER_S = 3600.0
HANG_S = 30.0


def cpu(cores: int = 2) -> Need:
    return Need(cores=cores, gpus=0, hardware="cpu")


def nodes_abc() -> list[Node]:
    return [Node("node-a", 8.0), Node("node-b", 8.0), Node("node-c", 4.0)]


class Inventory:
    """The book's inventory, counting its reads (the book reads it at most once per ``refresh_s``)."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = list(nodes)
        self.looks = 0
        self._cond = threading.Condition()

    def __call__(self) -> list[Node]:
        with self._cond:
            self.looks += 1
            self._cond.notify_all()
            return list(self.nodes)

    def wait_looks(self, n: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.looks >= n, timeout=HANG_S), f"{self.looks} looks, not {n}"


def wait_queued(book: NodeBook, n: int = 1) -> None:
    """Until ``n`` trials are queued in the book (queueing happens under the book's lock, so any later call that
    takes it runs after the waiter has queued)."""
    t0 = time.monotonic()
    while book.waiting() < n:
        assert time.monotonic() - t0 < HANG_S, f"{book.waiting()} queued, not {n}"
        time.sleep(0.001)


class Waiter:
    """Runs ``book.acquire`` on a thread; ``done`` is set when it returns or raises."""

    def __init__(self, book: NodeBook, owner: str, need: Need, **kw) -> None:
        self.done = threading.Event()
        self.node: str | None = None
        self.error: BaseException | None = None

        def main() -> None:
            try:
                self.node = book.acquire(owner, need, **kw)
            except BaseException as exc:  # noqa: BLE001 (the test inspects it)
                self.error = exc
            finally:
                self.done.set()

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()


# ---------------------------------------------------------------------- exclusive
def test_exclusive_one_trial_per_node():
    book = NodeBook(lambda: [Node("node-a", 8.0), Node("node-b", 8.0)], "exclusive", refresh_s=5.0)
    first = book.acquire("t1", cpu(2))
    second = book.acquire("t2", cpu(2))
    assert {first, second} == {"node-a", "node-b"}  # a 2-core trial does not share an 8-core node
    assert book.neighbours(first, "t1") == [] and book.neighbours(second, "t2") == []


def test_exclusive_second_acquire_blocks_until_release():
    inv = Inventory([Node("node-a", 8.0)])
    book = NodeBook(inv, "exclusive", refresh_s=NEVER_S)
    assert book.acquire("t1", cpu(1)) == "node-a"
    w = Waiter(book, "t2", cpu(1))
    wait_queued(book)  # the waiter has looked: it now waits
    assert book.in_use() == {"node-a": ["t1"]}, "a second trial got the exclusive node while it was held"
    book.release("node-a", "t1")
    assert w.done.wait(HANG_S), "the release did not wake the waiter (the refresh is an hour away)"
    assert inv.looks == 1  # the release handed the node over: nobody read the inventory again
    assert book.stats.handoffs == 1 and book.stats.wakeups == 1
    assert w.error is None and w.node == "node-a"
    assert book.neighbours("node-a", "t2") == []


def test_release_of_unknown_owner_or_node_is_harmless():
    book = NodeBook(lambda: [Node("node-a", 8.0)], "exclusive")
    book.release("node-x", "nobody")
    assert book.acquire("t1", cpu(1)) == "node-a"
    book.release("node-a", "someone-else")
    with pytest.raises(TimeoutError):
        book.acquire("t2", cpu(1), timeout_s=0.0)  # t1 still holds it


# ---------------------------------------------------------------------- packed
def test_packed_fits_trials_while_cores_last_and_lists_neighbours():
    inv = Inventory([Node("node-a", 8.0)])
    book = NodeBook(inv, "packed", refresh_s=NEVER_S)
    got = [book.acquire(f"t{i}", cpu(3)) for i in range(2)]
    assert got == ["node-a", "node-a"]
    assert book.neighbours("node-a", "t0") == ["t1"]
    assert book.acquire("t2", cpu(2)) == "node-a"  # 3 + 3 + 2 = 8 cores: exactly full
    assert book.neighbours("node-a", "t2") == ["t0", "t1"]
    w = Waiter(book, "t3", cpu(1))
    wait_queued(book)
    assert book.in_use() == {"node-a": ["t0", "t1", "t2"]}, "packed went past the node's cores"
    book.release("node-a", "t1")
    assert w.done.wait(HANG_S) and w.node == "node-a"
    assert book.neighbours("node-a", "t3") == ["t0", "t2"]


def test_packed_gpus_run_out_before_cores():
    book = NodeBook(lambda: [Node("gpu-1", 64.0, 2.0, frozenset({"H100"}))], "packed")
    need = Need(cores=4, gpus=1, hardware="H100")
    assert book.acquire("t1", need) == "gpu-1"
    assert book.acquire("t2", need) == "gpu-1"
    with pytest.raises(TimeoutError):
        book.acquire("t3", need, timeout_s=0.0)  # 56 cores left, but no GPU
    assert book.acquire("t4", Need(cores=4, gpus=0, hardware="cpu")) == "gpu-1"  # a CPU trial still fits


def test_packed_fills_the_emptiest_node_first():
    book = NodeBook(lambda: [Node("node-a", 8.0), Node("node-b", 8.0)], "packed")
    assert book.acquire("t1", cpu(4)) == "node-a"  # tie: by id
    assert book.acquire("t2", cpu(2)) == "node-b"
    assert book.acquire("t3", cpu(1)) == "node-b"  # b holds 2 cores, a holds 4
    assert book.neighbours("node-b", "t2") == ["t3"]
    assert book.neighbours("node-a", "t1") == []


# ---------------------------------------------------------------------- hardware
def test_hardware_targeting():
    inv = [Node("cpu-1", 32.0), Node("h100-1", 32.0, 8.0, frozenset({"H100"})),
           Node("h200-1", 32.0, 8.0, frozenset({"H200"}))]
    book = NodeBook(lambda: inv, "packed")
    for i in range(4):
        assert book.acquire(f"h{i}", Need(cores=2, gpus=1, hardware="H100")) == "h100-1"
    assert book.acquire("g", Need(cores=2, gpus=1, hardware="H200")) == "h200-1"
    with pytest.raises(TimeoutError):  # 24 cores left on h100-1, but an H100 trial never goes elsewhere
        book.acquire("h-more", Need(cores=2, gpus=5, hardware="H100"), timeout_s=0.0)
    # "cpu" lands anywhere, GPU nodes included
    excl = NodeBook(lambda: inv, "exclusive")
    landed = {excl.acquire(f"c{i}", Need(cores=2, gpus=0, hardware="cpu")) for i in range(3)}
    assert landed == {"cpu-1", "h100-1", "h200-1"}
    only_gpu = NodeBook(lambda: [inv[1]], "packed")
    assert only_gpu.acquire("c", Need(cores=2, gpus=0, hardware="cpu")) == "h100-1"


def test_hardware_targeting_exclusive_waits_for_its_kind():
    inv = Inventory([Node("cpu-1", 32.0), Node("h100-1", 32.0, 8.0, frozenset({"H100"}))])
    book = NodeBook(inv, "exclusive", refresh_s=NEVER_S)
    assert book.acquire("h1", Need(cores=2, gpus=1, hardware="H100")) == "h100-1"
    w = Waiter(book, "h2", Need(cores=2, gpus=1, hardware="H100"))
    wait_queued(book)
    assert book.in_use() == {"h100-1": ["h1"]}, "an H100 trial must not take the CPU node"
    assert book.acquire("c1", cpu(2)) == "cpu-1"
    book.release("h100-1", "h1")
    assert w.done.wait(HANG_S) and w.node == "h100-1"


# ---------------------------------------------------------------------- CannotPlace
@pytest.mark.parametrize("need, why", [
    (Need(cores=64, gpus=0, hardware="cpu"), "too many cores"),
    (Need(cores=1, gpus=0, hardware="B200"), "unknown hardware"),
    (Need(cores=1, gpus=4, hardware="H100"), "too many GPUs"),
    (Need(cores=16, gpus=1, hardware="H100"), "H100 node too small in cores"),
])
def test_cannot_place_at_once_even_while_nodes_are_busy(need, why):
    inv = Inventory([Node("cpu-node-1", 16.0), Node("h100-node-1", 8.0, 2.0, frozenset({"H100"}))])
    book = NodeBook(inv, "exclusive", refresh_s=NEVER_S)
    book.acquire("busy1", cpu(1))
    book.acquire("busy2", cpu(1))  # every node is busy: a wait would last until the timeout
    with pytest.raises(CannotPlace) as info:
        book.acquire("t", need, timeout_s=10.0)
    assert book.stats.waits == 0, why  # at once: raised at the first look, before any wait
    msg = str(info.value)
    assert str(need) in msg  # what the trial needs ...
    assert "16 CPU, 0 GPU" in msg and "8 CPU, 2 GPU, H100" in msg  # ... and what the nodes have
    assert "cpu-node" in msg and "h100-nod" in msg  # node ids (first 8 characters)


def test_cannot_place_when_there_are_no_nodes():
    book = NodeBook(lambda: [], "packed")
    with pytest.raises(CannotPlace, match="nodes: none"):
        book.acquire("t", cpu(1))


def test_why_never_is_none_when_some_node_fits():
    book = NodeBook(nodes_abc, "exclusive")
    assert book.why_never(cpu(8)) is None
    assert "9 cores" in book.why_never(cpu(9))


def test_cannot_place_is_raised_to_a_waiter_when_the_fitting_node_disappears():
    inv = Inventory([Node("big", 16.0), Node("small", 2.0)])
    book = NodeBook(inv, "exclusive", refresh_s=0.05)  # the refresh is what sees the node go
    assert book.acquire("t1", cpu(8)) == "big"
    w = Waiter(book, "t2", cpu(8))
    wait_queued(book)
    assert book.in_use() == {"big": ["t1"]}
    inv.nodes.pop(0)  # the only node that could hold 8 cores leaves the cluster
    assert w.done.wait(HANG_S)
    assert isinstance(w.error, CannotPlace) and "2 CPU" in str(w.error)


# ---------------------------------------------------------------------- avoid
def test_avoid_sends_the_retry_to_another_node():
    book = NodeBook(lambda: [Node("node-a", 8.0), Node("node-b", 8.0)], "exclusive")
    first = book.acquire("t#1", cpu(2), trial_id="t")
    assert first == "node-a"
    book.release(first, "t#1")
    book.avoid("t", first)
    assert book.acquire("t#2", cpu(2), trial_id="t") == "node-b"
    # another trial is not affected by t's avoid list
    assert book.acquire("u#1", cpu(2), trial_id="u") == "node-a"


def test_avoid_waits_for_another_fitting_node_rather_than_taking_the_avoided_one():
    inv = Inventory([Node("node-a", 8.0), Node("node-b", 8.0)])
    book = NodeBook(inv, "exclusive", refresh_s=NEVER_S)
    book.avoid("t", "node-a")
    assert book.acquire("other", cpu(2)) == "node-a"
    book.release("node-a", "other")
    assert book.acquire("busy", cpu(2)) == "node-a"
    assert book.acquire("busy-b", cpu(2)) == "node-b"
    w = Waiter(book, "t#2", cpu(2), trial_id="t")
    wait_queued(book)  # both nodes busy: it waits
    book.release("node-a", "busy")  # the avoided node frees up first: not taken while b fits
    assert book.in_use() == {"node-b": ["busy-b"]}  # the release left node-a alone ...
    assert book.waiting() == 1 and book.stats.wakeups == 0  # ... and woke nobody
    book.release("node-b", "busy-b")
    assert w.done.wait(HANG_S) and w.node == "node-b"


def test_avoid_falls_back_to_the_avoided_node_when_it_is_the_only_one():
    book = NodeBook(lambda: [Node("node-a", 8.0), Node("tiny", 1.0)], "exclusive")
    book.avoid("t", "node-a")
    assert book.acquire("t#2", cpu(4), trial_id="t") == "node-a"  # "tiny" cannot hold 4 cores


def test_avoid_is_keyed_by_owner_without_trial_id():
    book = NodeBook(lambda: [Node("node-a", 8.0), Node("node-b", 8.0)], "packed")
    book.avoid("solo", "node-a")
    assert book.acquire("solo", cpu(1)) == "node-b"


# ---------------------------------------------------------------------- cancel
def test_cancel_wakes_a_blocked_acquire():
    inv = Inventory([Node("node-a", 8.0)])
    book = NodeBook(inv, "exclusive", refresh_s=NEVER_S)
    book.acquire("t1", cpu(1))
    w = Waiter(book, "t2", cpu(1))
    wait_queued(book)  # it waits
    book.cancel()
    assert w.done.wait(HANG_S), "the cancel did not wake the waiter (the refresh is an hour away)"
    assert isinstance(w.error, Cancelled)
    with pytest.raises(Cancelled):  # and later acquires fail at once too
        book.acquire("t3", cpu(1))


# ---------------------------------------------------------------------- inventory changes
def test_a_node_that_joins_later_is_used_by_a_waiting_acquire():
    inv = Inventory([Node("node-a", 8.0)])
    book = NodeBook(inv, "exclusive", refresh_s=0.05)  # the refresh is what sees the node join
    book.acquire("t1", cpu(2))
    w = Waiter(book, "t2", cpu(2))
    wait_queued(book)
    assert book.in_use() == {"node-a": ["t1"]}
    inv.nodes.append(Node("node-new", 8.0))
    assert w.done.wait(HANG_S)
    assert w.error is None and w.node == "node-new"


def test_a_node_that_disappears_is_not_chosen():
    inv = [Node("node-a", 8.0), Node("node-b", 8.0)]
    book = NodeBook(lambda: list(inv), "packed", refresh_s=0)  # every look reads the inventory
    assert book.acquire("t1", cpu(1)) == "node-a"
    inv.remove(Node("node-b", 8.0))
    for i in range(4):
        assert book.acquire(f"t{i + 2}", cpu(1)) == "node-a"  # b would have been the emptiest
    inv.clear()
    inv.append(Node("node-c", 8.0))  # a leaves too (with its trials): the book only uses c
    assert book.acquire("t9", cpu(1)) == "node-c"


def test_a_vanished_node_comes_back_with_its_use_still_booked():
    inv = [Node("node-a", 4.0)]
    book = NodeBook(lambda: list(inv), "packed", refresh_s=0)
    book.acquire("t1", cpu(3))
    inv.clear()
    with pytest.raises(CannotPlace):
        book.acquire("t2", cpu(1))
    inv.append(Node("node-a", 4.0))
    assert book.acquire("t3", cpu(1)) == "node-a"
    with pytest.raises(TimeoutError):
        book.acquire("t4", cpu(1), timeout_s=0.0)  # t1's 3 cores + t3's 1 = full


# ---------------------------------------------------------------------- capacity
def test_capacity_exclusive_counts_fitting_nodes():
    inv = [Node("cpu-1", 16.0), Node("cpu-2", 4.0), Node("h100-1", 32.0, 8.0, frozenset({"H100"}))]
    book = NodeBook(lambda: inv, "exclusive")
    assert book.capacity([cpu(2)]) == 3
    assert book.capacity([cpu(8)]) == 2  # cpu-2 is too small
    assert book.capacity([Need(cores=2, gpus=1, hardware="H100")]) == 1
    assert book.capacity([cpu(8), Need(cores=2, gpus=1, hardware="H100")]) == 2
    assert book.capacity([Need(cores=2, gpus=0, hardware="B200")]) == 1  # at least 1
    assert book.capacity([]) == 1


def test_capacity_packed_counts_trials_per_node():
    inv = [Node("cpu-1", 16.0), Node("cpu-2", 4.0), Node("h100-1", 32.0, 2.0, frozenset({"H100"}))]
    book = NodeBook(lambda: inv, "packed")
    assert book.capacity([cpu(4)]) == 4 + 1 + 8
    assert book.capacity([cpu(4), cpu(8)]) == 4 + 1 + 8  # the smallest trial that fits decides
    assert book.capacity([cpu(8)]) == 2 + 0 + 4
    assert book.capacity([Need(cores=4, gpus=1, hardware="H100")]) == 2  # 8 by cores, 2 by GPUs
    assert book.capacity([cpu(64)]) == 1
    assert book.capacity([]) == 1


def test_capacity_rereads_the_inventory():
    inv = [Node("node-a", 8.0)]
    book = NodeBook(lambda: list(inv), "exclusive")
    assert book.capacity([cpu(1)]) == 1
    inv += [Node("node-b", 8.0), Node("node-c", 8.0)]
    assert book.capacity([cpu(1)]) == 3


# ---------------------------------------------------------------------- Node and Need
def test_node_from_ray_reads_resources_and_labels():
    info = {
        "NodeID": "abc123def456", "Alive": True,
        "Resources": {"CPU": 16.0, "GPU": 2.0, "accelerator_type:H100": 1.0, "memory": 1e9,
                      "node:10.0.0.1": 1.0},
        "Labels": {ACCEL_LABEL: "H100", "ray.io/node-id": "abc123def456"},
    }
    n = Node.from_ray(info)
    assert n == Node("abc123def456", 16.0, 2.0, frozenset({"H100"}))


def test_node_from_ray_label_only_resource_only_and_bare():
    by_label = Node.from_ray({"NodeID": "n1", "Resources": {"CPU": 8}, "Labels": {ACCEL_LABEL: "A10G"}})
    assert by_label.hardware == frozenset({"A10G"}) and by_label.cpus == 8.0 and by_label.gpus == 0.0
    by_res = Node.from_ray({"NodeID": "n2", "Resources": {"CPU": 4, "GPU": 1, "accelerator_type:L4": 1}})
    assert by_res.hardware == frozenset({"L4"}) and by_res.gpus == 1.0
    both = Node.from_ray({"NodeID": "n3", "Resources": {"accelerator_type:H200": 1},
                          "Labels": {ACCEL_LABEL: "H200-SXM"}})
    assert both.hardware == frozenset({"H200", "H200-SXM"})
    bare = Node.from_ray({"NodeID": "n4", "Resources": None, "Labels": None})
    assert bare == Node("n4", 0.0, 0.0, frozenset())
    assert isinstance(bare.cpus, float)


def test_need_matches():
    h100 = Node("h", 32.0, 8.0, frozenset({"H100"}))
    plain = Node("p", 32.0)
    assert Need(2, 0, "cpu").matches(h100) and Need(2, 0, "CPU").matches(plain)
    assert Need(2, 8, "H100").matches(h100) and not Need(2, 9, "H100").matches(h100)
    assert not Need(2, 1, "H100").matches(plain)
    assert not Need(33, 0, "cpu").matches(plain)
    assert str(Need(4, 1, "H100")) == "4 cores, 1 GPUs of H100"


# ---------------------------------------------------------------------- fixed: timeouts shorter than refresh_s
def test_acquire_timeout_is_honoured_when_shorter_than_refresh():
    book = NodeBook(lambda: [Node("node-a", 8.0)], "exclusive", refresh_s=NEVER_S)
    book.acquire("t1", cpu(1))
    w = Waiter(book, "t2", cpu(1), timeout_s=0.05)
    assert w.done.wait(HANG_S), "the 0.05 s timeout was not honoured (the refresh is an hour away)"
    assert isinstance(w.error, TimeoutError) and "0.05 s" in str(w.error)


# ---------------------------------------------------------------------- wake-ups and reads at scale
def h100(cores: int = 2) -> Need:
    return Need(cores=cores, gpus=1, hardware="H100")


def h200(cores: int = 2) -> Need:
    return Need(cores=cores, gpus=1, hardware="H200")


def test_a_release_wakes_only_the_oldest_waiter_of_its_kind_and_hands_it_the_node():
    nodes = [Node(f"h100-{i}", 32.0, 8.0, frozenset({"H100"})) for i in range(2)] + \
        [Node(f"h200-{i}", 32.0, 8.0, frozenset({"H200"})) for i in range(2)]
    inv = Inventory(nodes)
    book = NodeBook(inv, "exclusive", refresh_s=NEVER_S)
    for i, need in enumerate((h100(), h100(), h200(), h200())):
        book.acquire(f"busy{i}", need)
    handed: dict[str, list[str | None]] = {}
    for owner, need in (("a200", h200()), ("a100", h100()), ("b200", h200()), ("b100", h100())):
        assert book.acquire_or_queue(owner, need, handed.setdefault(owner, []).append) is None
    assert book.waiting() == 4
    book.release("h100-1", "busy1")
    assert handed == {"a200": [], "a100": ["h100-1"], "b200": [], "b100": []}  # the oldest H100 waiter alone
    assert book.stats.wakeups == 1 and book.in_use()["h100-1"] == ["a100"]
    book.release("h200-0", "busy2")
    assert handed["a200"] == ["h200-0"] and handed["b200"] == [] and book.stats.wakeups == 2
    assert inv.looks == 1  # nobody read the inventory again
    book.cancel()  # the rest are woken to look again (and learn the sweep is stopping)
    assert handed["b200"] == [None] and handed["b100"] == [None] and book.waiting() == 0


def test_a_cpu_waiter_takes_a_node_of_any_kind_in_its_turn():
    book = NodeBook(lambda: [Node("h100-0", 32.0, 8.0, frozenset({"H100"}))], "exclusive", refresh_s=NEVER_S)
    book.acquire("busy", h100())
    handed: dict[str, list[str | None]] = {"c": [], "g": []}
    assert book.acquire_or_queue("c", cpu(2), handed["c"].append) is None  # first in line
    assert book.acquire_or_queue("g", h100(), handed["g"].append) is None
    book.release("h100-0", "busy")
    assert handed == {"c": ["h100-0"], "g": []}


def test_looks_cost_no_inventory_read_and_stay_flat_as_nodes_grow():
    for n in (8, 4096):
        inv = Inventory([Node(f"n{i:05d}", 8.0, 1.0, frozenset({"H200"})) for i in range(n)])
        book = NodeBook(inv, "exclusive", refresh_s=NEVER_S)
        held = [book.acquire(f"t{i}", h200()) for i in range(n)]
        assert held == sorted(held) and len(set(held)) == n  # the lowest free id first, every node once
        for i in range(2000):
            node = held[i % n]
            book.release(node, f"t{i}" if i < n else f"u{i - n}")
            assert book.acquire(f"u{i}", h200()) == node  # the one free node
        assert inv.looks == 1, f"{inv.looks} inventory reads at {n} nodes"


def test_the_inventory_is_read_again_after_refresh_s_and_on_refresh():
    now = [0.0]
    inv = Inventory([Node("node-a", 8.0)])
    book = NodeBook(inv, "exclusive", refresh_s=2.0, clock=lambda: now[0])
    book.acquire("t1", cpu(1))
    book.release("node-a", "t1")
    book.acquire("t2", cpu(1))
    assert inv.looks == 1
    now[0] = 2.5
    book.release("node-a", "t2")
    book.acquire("t3", cpu(1))
    assert inv.looks == 2  # stale: read again
    inv.nodes.append(Node("node-b", 8.0))
    handed: list[str | None] = []
    book.refresh()  # a node joined, told now rather than at the next read
    assert inv.looks == 3 and book.acquire_or_queue("t4", cpu(1), handed.append) == "node-b"


def test_a_waiter_keeps_its_place_in_the_queue_across_its_refresh_looks():
    inv = Inventory([Node("node-a", 8.0)])
    book = NodeBook(inv, "exclusive", refresh_s=0.02)  # each waiter looks again every 20 ms
    book.acquire("t0", cpu(1))
    first = Waiter(book, "first", cpu(1))
    wait_queued(book, 1)
    second = Waiter(book, "second", cpu(1))
    wait_queued(book, 2)
    inv.wait_looks(inv.looks + 5)  # several refresh periods pass, both still waiting
    book.release("node-a", "t0")
    assert first.done.wait(HANG_S) and first.node == "node-a", "the older waiter lost its turn"
    assert not second.done.is_set() and book.waiting() == 1
    book.cancel()
    assert second.done.wait(HANG_S) and isinstance(second.error, Cancelled)


def test_cannot_place_names_each_shape_of_node_once_at_any_size():
    nodes = [Node(f"h100-{i:04d}", 128.0, 8.0, frozenset({"H100"})) for i in range(2048)] + \
        [Node(f"h200-{i:04d}", 128.0, 8.0, frozenset({"H200"})) for i in range(2048)]
    book = NodeBook(lambda: nodes, "exclusive")
    with pytest.raises(CannotPlace) as info:
        book.acquire("t", Need(cores=1, gpus=1, hardware="B200"))
    msg = str(info.value)
    assert "2048 nodes like h100-000: 128 CPU, 8 GPU, H100" in msg and "2048 nodes like h200-000" in msg
    assert len(msg) < 300
