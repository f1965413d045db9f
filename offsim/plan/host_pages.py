"""Fresh pageable host memory: what a copy pays when PyTorch allocates its host temporary anew.

A blocking CPU<->GPU ``copy_`` that changes the dtype converts on the CPU (PyTorch
``aten/src/ATen/native/cuda/Copy.cu`` ``copy_kernel_cuda``: for a blocking copy the conversion
runs on the CPU, so a GPU->CPU copy first lands in ``at::empty_like(dst, src dtype)``, a new
pageable tensor, and ``dst.copy_`` then casts it). That temporary comes from PyTorch's CPU
allocator (``c10/core/impl/alloc_cpu.cpp`` ``alloc_cpu``: ``posix_memalign``, no huge-page advice
unless ``THP_MEM_ALLOC_ENABLE`` is set), that is glibc's ``malloc``, which serves a request at or
above its mmap threshold with a new anonymous ``mmap`` and unmaps it on free. The threshold
starts at 128 KiB and rises with freed mapped chunks up to ``DEFAULT_MMAP_THRESHOLD_MAX``, 32 MiB
on 64-bit (glibc ``malloc/malloc.c``; mallopt(3) ``M_MMAP_THRESHOLD``), so a temporary of 32 MiB
or more is fresh pages every call. Its pages are faulted in (and zeroed by the kernel) on first
touch, here by the CUDA driver's copy out of its pinned staging buffer, on the one host thread
that issued the copy.

The rate of that first touch is measured, not derived: rapidsai/dask-cuda PR #98 (madsbk,
2019-08-01, a GV100 workstation) writes one element per page of a new 1 GiB ``numpy.empty`` in
0.3266 s, then the 1 GiB D2H into it runs at ~10 GB/s; without that pre-touch the D2H takes
0.5479 s, which is the fault cost moved into the driver's copy. With transparent huge pages set to
``always`` dask-cuda issue #106 (pentschev, 2019-08-02, a DGX-1) reports host memory allocated at
about 5 GB/s instead; which of the two a host runs is its kernel's setting, which no validation
case states, so offsim takes the 4 KiB-page figure (glibc asks for no huge pages).
"""

from __future__ import annotations

from collections.abc import Iterable

#: glibc's largest dynamic mmap threshold on 64-bit (``malloc/malloc.c``
#: ``DEFAULT_MMAP_THRESHOLD_MAX`` = 4 * 1024 * 1024 * sizeof(long)): a request at least this large
#: is always a new mapping
MMAP_THRESHOLD_MAX_BYTES = 32 * 2**20

#: first touch of fresh anonymous 4 KiB pages by one thread, bytes/s: 1 GiB in 0.3266 s
#: (rapidsai/dask-cuda PR #98, the "alloc" figure of its device_to_host split)
FRESH_PAGE_TOUCH_BYTES_PER_S = 2**30 / 0.3266


def fresh_bytes(tensor_bytes: Iterable[float]) -> float:
    """Bytes of the host temporaries that are fresh mappings: those of at least
    :data:`MMAP_THRESHOLD_MAX_BYTES` (smaller ones are taken as reusing the heap)."""
    return sum(b for b in tensor_bytes if b >= MMAP_THRESHOLD_MAX_BYTES)


def first_touch_s(nbytes: float) -> float:
    """Seconds one thread spends faulting in ``nbytes`` of fresh pages."""
    return nbytes / FRESH_PAGE_TOUCH_BYTES_PER_S
