"""Backends: the real CPU one (memfd + mmap), device parsing, and the clear errors of the ones this host lacks."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from worker.xtensor import BackendUnavailableError, XTensor, best_available_device, parse_device
from worker.xtensor.backends import open_backend
from worker.xtensor.backends.cpu import CpuBackend
from worker.xtensor.backends.cuda import cuda_unavailable_reason

PAGE = 64 * 1024


def test_parse_device_accepts_the_worker_forms_and_rejects_others():
    assert str(parse_device("cpu")) == "cpu"
    assert str(parse_device("cuda")) == "cuda:0"
    assert str(parse_device("CUDA:3")) == "cuda:3"
    assert str(parse_device("npu:1")) == "npu:1"
    for bad in ("gpu:0", "cuda:x", "cpu:1", ""):
        with pytest.raises(ValueError):
            parse_device(bad)


def test_cpu_pages_mapped_into_a_view_are_the_global_region_pages():
    backend = CpuBackend.open(8, PAGE)
    try:
        view = backend.reserve(4)
        backend.map_pages(view + PAGE, 5, 2, is_populate=True)  # slots 1-2 of the view -> pages 5-6
        view_tensor = backend.tensor(view, 4 * PAGE)
        view_tensor[PAGE: 3 * PAGE] = torch.arange(2 * PAGE, dtype=torch.int64).remainder(251).to(torch.uint8)
        global_tensor = backend.tensor(backend.global_base_address, 8 * PAGE)
        assert torch.equal(global_tensor[5 * PAGE: 7 * PAGE], view_tensor[PAGE: 3 * PAGE])
        global_tensor[6 * PAGE] = 77  # and back: a peer's write through the region shows in the view
        assert int(view_tensor[2 * PAGE]) == 77
        assert view_tensor.data_ptr() == view  # zero-copy
    finally:
        backend.close()


def test_punching_a_hole_returns_the_memory_and_zeroes_the_page():
    backend = CpuBackend.open(4, PAGE)
    try:
        view = backend.reserve(2)
        backend.map_pages(view, 0, 2, is_populate=True)
        backend.tensor(view, 2 * PAGE).fill_(9)
        assert backend.resident_bytes() >= 2 * PAGE
        backend.unmap_pages(view, 2)
        backend.discard_pages(0, 2)
        assert backend.resident_bytes() == 0
        backend.map_pages(view, 0, 1, is_populate=False)
        assert int(backend.tensor(view, PAGE).sum()) == 0
    finally:
        backend.close()


def test_touching_an_unmapped_page_of_a_view_faults():
    # In a child process: the fault kills it with SIGSEGV, which is the contract (a stale view never reads
    # another owner's data).
    script = textwrap.dedent(f"""
        import ctypes
        from worker.xtensor.backends.cpu import CpuBackend
        b = CpuBackend.open(4, {PAGE})
        v = b.reserve(2)
        b.map_pages(v, 0, 2, is_populate=False)
        ctypes.c_uint8.from_address(v).value = 1
        b.unmap_pages(v + {PAGE}, 1)
        print("mapped ok", ctypes.c_uint8.from_address(v).value, flush=True)
        ctypes.c_uint8.from_address(v + {PAGE}).value = 1
        print("unreachable", flush=True)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "mapped ok 1" in result.stdout and "unreachable" not in result.stdout
    assert result.returncode == -11  # SIGSEGV


def test_the_pool_bookkeeping_imports_without_torch():
    code = "import sys, worker.xtensor; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_cpu_page_size_must_be_a_multiple_of_the_os_page():
    with pytest.raises(ValueError, match="multiple"):
        CpuBackend.open(4, 1000)


def test_npu_without_torch_npu_names_what_is_missing():
    with pytest.raises(BackendUnavailableError, match="torch_npu"):
        open_backend("npu:0", 4, PAGE)


def test_cuda_probe_and_fallback_on_a_host_without_a_gpu():
    reason = cuda_unavailable_reason(0)
    if reason is None:
        pytest.skip("this host has a CUDA GPU; covered by the gpu tests")
    assert best_available_device() == "cpu"
    with pytest.raises(BackendUnavailableError, match="CUDA backend unavailable"):
        XTensor.open("cuda:0", 4 * 2 * 1024 * 1024)


@pytest.mark.gpu
def test_cuda_pool_views_share_pages_with_the_global_region():
    if cuda_unavailable_reason(0) is not None:
        pytest.skip(f"no usable CUDA device: {cuda_unavailable_reason(0)}")
    pool = XTensor.open("cuda:0", 16 * 2 * 1024 * 1024)
    try:
        weights = pool.allocate_weights("m", 3 * pool.page_size_bytes, "cuda:0")
        assert weights.is_cuda
        weights.fill_(5)
        offset, size = pool.weight_segments("m")[0]
        assert torch.all(pool.global_view(offset, size) == 5)
        kv = pool.reserve_kv("m", 4, "cuda:0")
        pool.run_kv_maintenance()
        (slot,) = pool.acquire_kv_pages("m", 1)
        kv[slot * pool.page_size_bytes:(slot + 1) * pool.page_size_bytes] = 3
        offset = pool.kv_page_global_offset("m", slot)
        assert torch.all(pool.global_view(offset, pool.page_size_bytes) == 3)
        pool.sleep("m")
        pool.wake("m")
        weights.fill_(6)  # the view is valid again after wake
        torch.cuda.synchronize()
        assert torch.all(weights == 6)
    finally:
        pool.close()
