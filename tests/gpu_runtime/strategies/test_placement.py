import sys
import types

import pytest

from gpu_runtime.placement import (
    LinkLevel,
    PlacementError,
    build_link_matrix,
    cuda_bus_ids,
    cuda_indices_for,
    normalize_bus_id,
    place_job,
    read_topology,
    worst_link,
)

SYSTEM, NODE, PHB = 50, 40, 30


def two_islands_with_nvlink_pairs(n_islands=2, per_island=4):
    """NUMA islands of `per_island` GPUs; GPUs (0,1), (2,3) ... joined by NVLink."""
    n = n_islands * per_island
    ancestors = {}
    for i in range(n):
        for j in range(i + 1, n):
            ancestors[(i, j)] = NODE if i // per_island == j // per_island else SYSTEM
    pairs = [(i, i + 1) for i in range(0, n, 2)]
    return build_link_matrix(n, ancestors, pairs)


LEVELS = two_islands_with_nvlink_pairs()


def test_matrix_is_symmetric_and_nvlink_overrides_the_pcie_level():
    assert all(LEVELS[i][j] == LEVELS[j][i] for i in range(8) for j in range(8))
    assert LEVELS[0][0] == LinkLevel.SAME
    assert LEVELS[0][1] == LinkLevel.NVLINK
    assert LEVELS[1][2] == LinkLevel.NODE
    assert LEVELS[3][4] == LinkLevel.SYS


def test_topology_aware_picks_the_nvlink_pair():
    assert place_job(LEVELS, 2, strategy="topology_aware") == (0, 1)
    assert place_job(LEVELS, 2, strategy="topology_aware", available=[0, 2, 3]) == (2, 3)
    assert place_job(LEVELS, 2, strategy="topology_aware", available=[1, 3, 4, 5]) == (4, 5)


def test_round_robin_ignores_topology_where_topology_aware_does_not():
    rr = place_job(LEVELS, 2, strategy="round_robin", available=[0, 2, 3])
    ta = place_job(LEVELS, 2, strategy="topology_aware", available=[0, 2, 3])
    assert rr == (0, 2) and worst_link(LEVELS, rr) == LinkLevel.NODE
    assert worst_link(LEVELS, ta) == LinkLevel.NVLINK


def test_four_gpu_job_stays_inside_one_numa_island():
    job = place_job(LEVELS, 4, strategy="topology_aware", available=[2, 3, 4, 5, 6, 7])
    assert job == (4, 5, 6, 7)
    assert worst_link(LEVELS, job) == LinkLevel.NODE
    crossing = place_job(LEVELS, 4, strategy="round_robin", offset=2)
    assert crossing == (2, 3, 4, 5) and worst_link(LEVELS, crossing) == LinkLevel.SYS


def test_round_robin_wraps_around_from_the_offset():
    assert place_job(LEVELS, 3, strategy="round_robin", offset=6) == (0, 6, 7)


def test_ties_break_on_the_lowest_indices():
    # both islands are alike: the first one wins, every time
    assert place_job(LEVELS, 4, strategy="topology_aware") == (0, 1, 2, 3)


def test_large_machine_uses_the_greedy_search_and_still_keeps_an_island():
    levels = two_islands_with_nvlink_pairs(n_islands=4, per_island=8)  # 32 GPUs, C(32,16) sets
    job = place_job(levels, 8, strategy="topology_aware", available=range(5, 32))
    assert worst_link(levels, job) == LinkLevel.NODE
    assert job == tuple(range(8, 16))


def test_one_gpu_or_none_degrade_to_the_obvious_choice():
    assert place_job([[0]], 1, strategy="topology_aware") == (0,)
    assert place_job([[0]], 1, strategy="round_robin", offset=5) == (0,)
    assert place_job([], 0, strategy="topology_aware") == ()


def test_more_gpus_than_exist_is_a_clear_error():
    with pytest.raises(PlacementError, match="needs 9 GPU.*8 present"):
        place_job(LEVELS, 9, strategy="topology_aware")
    with pytest.raises(PlacementError, match="needs 1 GPU.*0 present"):
        place_job([], 1, strategy="round_robin")


def test_unknown_strategy_names_the_key():
    with pytest.raises(PlacementError, match="placement.strategy"):
        place_job(LEVELS, 2, strategy="random")


def test_bus_ids_from_nvml_and_cuda_are_matched():
    assert normalize_bus_id(b"00000000:89:00.0") == "0000:89:00.0"
    assert normalize_bus_id("0000:1A:00.0") == "0000:1a:00.0"
    assert cuda_indices_for(
        ["00000000:1A:00.0", "00000000:0B:00.0"], ["0000:0b:00.0", "0000:1a:00.0"]
    ) == (1, 0)
    with pytest.raises(PlacementError, match="not visible to CUDA"):
        cuda_indices_for(["00000000:1A:00.0"], ["0000:0b:00.0"])


def _fake_pynvml(bus_ids, ancestors, links, switch_gpus=()):
    """A stand-in for pynvml: `links[i]` lists the GPUs that GPU i's active NVLinks reach."""

    class NVMLError(Exception):
        pass

    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_NVLINK_MAX_LINKS = 4
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_NVLINK_DEVICE_TYPE_GPU = 0
    m.NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(bus_ids)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus_ids[h].encode())
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: ancestors[(min(a, b), max(a, b))]

    def state(h, link):
        if h in switch_gpus:
            return 1 if link == 0 else 0
        if link >= len(links.get(h, ())):
            raise NVMLError("link not present")
        return 1

    m.nvmlDeviceGetNvLinkState = state
    m.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, link: 2 if h in switch_gpus else 0
    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(
        busId=bus_ids[links[h][link]].encode()
    )
    return m


def test_read_topology_through_nvml_finds_direct_nvlink_pairs(monkeypatch):
    bus = ["00000000:0A:00.0", "00000000:0B:00.0", "00000000:8A:00.0", "00000000:8B:00.0"]
    anc = {(0, 1): PHB, (0, 2): SYSTEM, (0, 3): SYSTEM, (1, 2): SYSTEM, (1, 3): SYSTEM, (2, 3): PHB}
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(bus, anc, {0: [1], 1: [0]}))
    topo = read_topology()
    assert topo.bus_ids[0] == "0000:0a:00.0"
    assert topo.levels[0][1] == LinkLevel.NVLINK
    assert topo.levels[2][3] == LinkLevel.PHB
    assert topo.levels[1][2] == LinkLevel.SYS
    assert place_job(topo.levels, 2, strategy="topology_aware", available=[1, 0, 3]) == (0, 1)


def test_read_topology_treats_gpus_on_an_nvswitch_as_nvlinked(monkeypatch):
    bus = ["00000000:0A:00.0", "00000000:0B:00.0", "00000000:8A:00.0"]
    anc = {(0, 1): NODE, (0, 2): SYSTEM, (1, 2): SYSTEM}
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(bus, anc, {}, switch_gpus={0, 2}))
    topo = read_topology()
    assert topo.levels[0][2] == LinkLevel.NVLINK
    assert topo.levels[0][1] == LinkLevel.NODE


def test_cuda_bus_ids_are_formatted_like_nvml_ones(monkeypatch):
    import torch

    props = [
        types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x8A, pci_device_id=0),
        types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x0A, pci_device_id=0),
    ]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    assert cuda_bus_ids() == ["0000:8a:00.0", "0000:0a:00.0"]
    assert cuda_indices_for(["00000000:0A:00.0", "00000000:8A:00.0"], cuda_bus_ids()) == (1, 0)
