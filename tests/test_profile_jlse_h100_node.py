"""The JLSE H100 testbed profile (hardware_profiles/jlse-h100-node.yaml): it loads, and each figure
equals the value its provenance cites or the arithmetic its notes give (issue 23: the MLP-Offload
artifact's node, named by DataStates/artifacts MLP-Offload/scripts/installs.sh)."""

from __future__ import annotations

import pytest

from offsim.config.loading import load_profile
from offsim.plan.cpu_adam import ADAM_DRAM_EFFICIENCY, ADAM_FP32_BYTES_PER_PARAM, CpuSimd

GIB = 2**30


@pytest.fixture(scope="module")
def profile():
    return load_profile("jlse-h100-node")


def test_node_shape_from_the_70b_logs(profile) -> None:
    # numactl -C 0-45 / 96-141 on node 0, 48-93 / 144-189 on node 1: 2 sockets x 48 cores x 2 threads
    assert profile.cpu.sockets == 2
    assert profile.cpu.cores == 2 * 48
    # "Adam Optimizer #0 is created with AVX512 arithmetic capability"
    assert profile.cpu.simd is CpuSimd.AVX512
    # CUDA_VISIBLE_DEVICES=0,1,2,3, nnodes=1
    assert profile.topology.gpus_per_node == 4
    assert profile.topology.nodes == 1
    # 372.55 GB = 74.0% -> 503.4 GiB visible: a 512 GiB node, of which the 0.9 usable share is below what the OS sees
    assert profile.dram.capacity_gib == 512.0
    assert profile.dram.capacity_gib * profile.dram.usable_fraction < 372.55 / 0.740


def test_gpu_is_the_h100_sxm5_datasheet(profile) -> None:
    # hardware_facts.md 1.1: H100 SXM5 989 TFLOPS bf16/fp16 dense, 67 fp32, 3,350 GB/s; deviceQuery 85,045,477,376 B
    gpu = profile.gpu
    assert gpu.peak_tflops["bf16"] == gpu.peak_tflops["fp16"] == 989.0
    assert gpu.peak_tflops["fp32"] == 67.0
    assert gpu.hbm_bandwidth_gb_per_s == 3350.0
    assert gpu.memory_gib == pytest.approx(85_045_477_376 / GIB, abs=0.05)
    assert gpu.copy_engines == 3
    # the same figures and GEMM curve as the project's H100 SXM5 profile
    h100 = load_profile("h100-sxm5-gen5").gpu
    assert gpu.peak_tflops == h100.peak_tflops
    assert gpu.gemm_efficiency == h100.gemm_efficiency


def test_links(profile) -> None:
    # Gen5 x16 as measured on the HGX H100 + 8480C platform (Azure nvbandwidth 51 / 52 GB/s)
    link = profile.host_link
    assert (link.generation, link.lanes) == (5, 16)
    assert link.h2d.pinned.bandwidth_gb_per_s == 51.0
    assert link.d2h.pinned.bandwidth_gb_per_s == 52.0
    assert link.h2d.pageable.bandwidth_gb_per_s == 0.5 * 51.0
    # 18 NVLink4 links / 3 peers = 6 links x 25 GB/s per direction to each peer
    assert profile.topology.gpu_link.kind == "nvlink"
    assert profile.topology.gpu_link.bandwidth_gb_per_s == 18 // 3 * 25.0


def test_dram_and_cpu_adam_derivation(profile) -> None:
    # 2 sockets x 8 channels x DDR5-4800 (38.4 GB/s) x 0.78 STREAM efficiency
    assert profile.dram.bandwidth_gb_per_s == pytest.approx(2 * 8 * 38.4 * 0.78, abs=0.5)
    assert profile.cpu.memcpy_gb_per_s == pytest.approx(profile.dram.bandwidth_gb_per_s / 2, abs=0.5)
    # no clock and 48 threads per rank: the node rate is the DRAM bound, 0.548 x 479 GB/s / 28 B
    expected = ADAM_DRAM_EFFICIENCY * 479.0e9 / ADAM_FP32_BYTES_PER_PARAM
    assert profile.cpu.optimizer_params_per_s == pytest.approx(expected, rel=1e-9)


def test_storage_is_the_polaris_stand_in(profile) -> None:
    # NVMe and VAST rates are not in any source: carried over from polaris-a100-grand unchanged
    polaris = load_profile("polaris-a100-grand")
    for field in ("drives", "read_gb_per_s", "write_gb_per_s", "raid_efficiency"):
        assert getattr(profile.nvme, field) == getattr(polaris.nvme, field)
    assert profile.pfs.read_gb_per_s == polaris.pfs.read_gb_per_s == 4.06
    assert profile.pfs.write_gb_per_s == polaris.pfs.write_gb_per_s


def test_assumed_ranges_span_the_unnamed_parts(profile) -> None:
    # H100 PCIe (756 TFLOPS, 2,000 GB/s) to SXM5; per-peer to per-GPU NVLink; SPR DDR5-4400 to Zen 4 12-channel
    spans = {path: r.range for path, r in profile.assumed.items()}
    assert spans["gpu.peak_tflops.bf16"] == (756.0, 989.0)
    assert spans["gpu.hbm_bandwidth_gb_per_s"] == (2000.0, 3350.0)
    # as achieved (issue 23 part 3, f9): each end at the unidirectional share an 8-GPU HGX H100
    # reaches, ~380 of 450 GB/s (hardware_facts.md 1.3): 150 x 380 / 450 = 126.7 to 380
    assert spans["topology.gpu_link.bandwidth_gb_per_s"] == (round(150.0 * 380 / 450, 1), 18 * 25.0 * 380 / 450)
    low, high = spans["dram.bandwidth_gb_per_s"]
    assert low == pytest.approx(2 * 8 * 4.4 * 8 * 0.78, abs=0.5)
    assert high == pytest.approx(2 * 12 * 38.4 * 0.78, abs=0.5)
