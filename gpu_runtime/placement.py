"""Which GPUs a job runs on: NVML topology -> link-level matrix -> placement.

Everything but `read_topology` is a pure function over a matrix of link levels, so
placement is tested on hand-made topologies without a GPU.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

STRATEGIES = ("round_robin", "topology_aware")
# Above this many candidate sets the exact search gives way to a greedy one.
_EXHAUSTIVE_LIMIT = 20_000


class PlacementError(ValueError):
    """A placement request that cannot be met; the message names the key and the reason."""


class LinkLevel(IntEnum):
    """How far apart two GPUs are; lower is closer (nvidia-smi topo -m order)."""

    SAME = 0  # the device itself
    NVLINK = 1  # NVLink, direct or through NVSwitch
    PIX = 2  # one PCIe switch
    PXB = 3  # several PCIe switches, no host bridge
    PHB = 4  # through a PCIe host bridge (the CPU)
    NODE = 5  # host bridges within one NUMA node
    SYS = 6  # across NUMA nodes (SMP interconnect)


# nvmlGpuTopologyLevel_t values (NVML_TOPOLOGY_*); CPU and NODE share 40.
_NVML_LEVELS = {
    0: LinkLevel.SAME,
    10: LinkLevel.PIX,
    20: LinkLevel.PXB,
    30: LinkLevel.PHB,
    40: LinkLevel.NODE,
    50: LinkLevel.SYS,
}


@dataclass(frozen=True)
class Topology:
    """PCI bus ids in NVML order and the symmetric link-level matrix between them."""

    bus_ids: tuple[str, ...]
    levels: tuple[tuple[LinkLevel, ...], ...]


def link_level_from_nvml(common_ancestor: int, *, nvlink: bool) -> LinkLevel:
    """Map an NVML common-ancestor level (and whether NVLink joins the pair) to a LinkLevel."""
    if nvlink:
        return LinkLevel.NVLINK
    try:
        return _NVML_LEVELS[common_ancestor]
    except KeyError:
        raise PlacementError(f"placement: unknown NVML topology level {common_ancestor}") from None


def build_link_matrix(
    n: int,
    common_ancestor: Mapping[tuple[int, int], int],
    nvlink_pairs: Iterable[tuple[int, int]] = (),
) -> tuple[tuple[LinkLevel, ...], ...]:
    """Symmetric n x n matrix from per-pair NVML ancestors (either order) and NVLink pairs."""
    linked = {frozenset(p) for p in nvlink_pairs}
    rows = []
    for i in range(n):
        row = []
        for j in range(n):
            if i == j:
                row.append(LinkLevel.SAME)
                continue
            ancestor = common_ancestor.get((i, j), common_ancestor.get((j, i)))
            if ancestor is None:
                raise PlacementError(f"placement: no topology level for GPUs {i} and {j}")
            row.append(link_level_from_nvml(ancestor, nvlink=frozenset((i, j)) in linked))
        rows.append(tuple(row))
    return tuple(rows)


def normalize_bus_id(bus_id: str | bytes) -> str:
    """'00000000:89:00.0' (NVML) and '0000:89:00.0' (CUDA) -> '0000:89:00.0'."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    text = text.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    return f"0000:{text}" if len(parts) == 2 else text


def cuda_indices_for(nvml_bus_ids: Sequence[str], cuda_bus_ids: Sequence[str]) -> tuple[int, ...]:
    """For each NVML device, its CUDA index (CUDA may enumerate in another order)."""
    by_bus = {normalize_bus_id(b): i for i, b in enumerate(cuda_bus_ids)}
    try:
        return tuple(by_bus[normalize_bus_id(b)] for b in nvml_bus_ids)
    except KeyError as missing:
        raise PlacementError(
            f"placement: GPU {missing} seen by NVML is not visible to CUDA"
        ) from None


def cuda_bus_ids() -> list[str]:
    """PCI bus id of each CUDA device, in CUDA's order, for `cuda_indices_for`."""
    import torch

    ids = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        bus, device = getattr(props, "pci_bus_id", None), getattr(props, "pci_device_id", None)
        if bus is None or device is None:
            raise PlacementError(
                "placement: this PyTorch build does not report PCI bus ids; "
                "set CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA and NVML agree"
            )
        ids.append(f"{getattr(props, 'pci_domain_id', 0) or 0:04x}:{bus:02x}:{device:02x}.0")
    return ids


def read_topology() -> Topology:
    """Read bus ids, common ancestors and NVLink peers of every GPU through NVML."""
    import pynvml  # lazy: machines without a driver never import it

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        bus_ids = tuple(normalize_bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId) for h in handles)
        ancestors = {
            (i, j): pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
            for i, j in itertools.combinations(range(len(handles)), 2)
        }
        peers = [_nvlink_peers(pynvml, h) for h in handles]
        pairs = set()
        for i, j in itertools.combinations(range(len(handles)), 2):
            direct = bus_ids[j] in peers[i][0] or bus_ids[i] in peers[j][0]
            through_switch = peers[i][1] and peers[j][1]
            if direct or through_switch:
                pairs.add((i, j))
        return Topology(bus_ids, build_link_matrix(len(handles), ancestors, pairs))
    finally:
        pynvml.nvmlShutdown()


def _nvlink_peers(pynvml, handle) -> tuple[set[str], bool]:
    """Bus ids of GPUs on the other end of active links, and whether a link goes to an NVSwitch."""
    peers: set[str] = set()
    switch = False
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
        except pynvml.NVMLError:
            continue  # link absent or NVLink unsupported on this GPU
        try:
            kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except pynvml.NVMLError:
            kind = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            switch = True
            continue
        try:
            peers.add(normalize_bus_id(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except pynvml.NVMLError:
            continue
    return peers, switch


def worst_link(levels: Sequence[Sequence[int]], devices: Sequence[int]) -> LinkLevel:
    """The slowest link between any two devices of a job (SAME for one device)."""
    return max(
        (LinkLevel(levels[a][b]) for a, b in itertools.combinations(devices, 2)),
        default=LinkLevel.SAME,
    )


def place_job(
    levels: Sequence[Sequence[int]],
    k: int,
    *,
    strategy: str,
    available: Iterable[int] | None = None,
    offset: int = 0,
) -> tuple[int, ...]:
    """Pick k GPUs (indices into `levels`), sorted.

    `round_robin` takes the first k free GPUs in cyclic order from `offset`;
    `topology_aware` minimises the worst link inside the job, then the sum of its
    links, then the indices (deterministic). k == 0 (a CPU job) places nothing.
    """
    if strategy not in STRATEGIES:
        raise PlacementError(
            f"placement.strategy: {strategy!r} is not one of {', '.join(STRATEGIES)}"
        )
    n = len(levels)
    free = sorted(set(range(n) if available is None else available))
    if any(not 0 <= d < n for d in free):
        raise PlacementError(f"placement: available GPUs {free} outside 0..{n - 1}")
    if k < 0:
        raise PlacementError(f"placement: cannot place {k} GPUs")
    if k > len(free):
        raise PlacementError(
            f"placement: the job needs {k} GPU(s) but only {len(free)} of {n} present are free"
        )
    if k == 0:
        return ()
    if k == len(free):
        return tuple(free)
    if strategy == "round_robin":
        start = offset % n
        ordered = sorted(free, key=lambda d: (d - start) % n)
        return tuple(sorted(ordered[:k]))
    return _closest_set(levels, free, k)


def _cost(
    levels: Sequence[Sequence[int]], devices: Sequence[int]
) -> tuple[int, int, tuple[int, ...]]:
    links = [levels[a][b] for a, b in itertools.combinations(devices, 2)]
    return max(links, default=0), sum(links), tuple(devices)


def _closest_set(levels: Sequence[Sequence[int]], free: list[int], k: int) -> tuple[int, ...]:
    candidates: Iterable[Sequence[int]]
    if math.comb(len(free), k) <= _EXHAUSTIVE_LIMIT:
        candidates = itertools.combinations(free, k)
    else:
        candidates = [_grow_greedily(levels, free, seed, k) for seed in free]
    return min(_cost(levels, c) for c in candidates)[2]


def _grow_greedily(
    levels: Sequence[Sequence[int]], free: list[int], seed: int, k: int
) -> tuple[int, ...]:
    group = [seed]
    while len(group) < k:
        best = min(
            (d for d in free if d not in group),
            key=lambda d: (max(levels[d][g] for g in group), sum(levels[d][g] for g in group), d),
        )
        group.append(best)
    return tuple(sorted(group))


def busy_gpus() -> set[int]:
    """NVML indices of GPUs running another process's compute work."""
    import os

    import pynvml

    pynvml.nvmlInit()
    try:
        busy = set()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            if any(
                p.pid != os.getpid() for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            ):
                busy.add(index)
        return busy
    finally:
        pynvml.nvmlShutdown()


def choose_device(*, strategy: str, gpus: int, requested: str | None) -> tuple[str | None, dict]:
    """The device a run should train on, and what placement did (it goes into the RunResult).

    An explicit `cuda:N` or `cpu` is honoured (a worker that owns a GPU passes one). With
    none, or a bare `cuda`, the job is placed on the GPUs CUDA can see, idle ones first,
    by `strategy`; the run trains on the first of them. No GPU: nothing to place.
    """
    import torch

    report: dict = {"strategy": strategy, "gpus": gpus, "devices": []}
    if requested not in (None, "cuda") or not torch.cuda.is_available():
        report["how"] = "requested" if requested not in (None, "cuda") else "no GPU"
        return requested, report
    try:
        topology, busy = read_topology(), busy_gpus()
        visible_bus = {normalize_bus_id(b): i for i, b in enumerate(cuda_bus_ids())}
    except Exception as exc:  # no NVML, no bus ids: the obvious choice, said so
        report["how"] = f"first GPU (topology unreadable: {str(exc)[:120]})"
        return requested, report
    to_cuda = {
        n: visible_bus[normalize_bus_id(b)]
        for n, b in enumerate(topology.bus_ids)
        if normalize_bus_id(b) in visible_bus
    }
    if not to_cuda:
        report["how"] = "first GPU (no GPU NVML lists is visible to CUDA)"
        return requested, report
    idle = [n for n in to_cuda if n not in busy]
    chosen = place_job(
        topology.levels,
        gpus,
        strategy=strategy,
        available=idle if len(idle) >= gpus else list(to_cuda),
    )
    report.update(
        how="placed",
        devices=[to_cuda[n] for n in chosen],
        busy=sorted(busy),
        worst_link=worst_link(topology.levels, chosen).name,
    )
    return f"cuda:{to_cuda[chosen[0]]}", report
