"""Fresh pageable host memory: what a copy pays when PyTorch allocates its host temporary anew.

A blocking CPU<->GPU ``copy_`` that changes the dtype converts on the CPU (PyTorch
``aten/src/ATen/native/cuda/Copy.cu`` ``copy_kernel_cuda``: ``conversion_device`` is the CPU
unless ``non_blocking``), through a new pageable host tensor:

- GPU->CPU: the copy lands in ``at::empty_like(dst, src dtype)`` and ``dst.copy_`` then casts
  it; the CUDA driver's copy out of its pinned staging buffer writes the new pages first
  (:func:`with_first_touch`);
- CPU->GPU: ``src.to(dst dtype)`` casts into a new tensor, whose pages the CPU cast writes first,
  then a same-dtype pageable H2D sends it (:func:`touch_flow`, in series with the cast).

That temporary comes from PyTorch's CPU allocator (``c10/core/impl/alloc_cpu.cpp`` ``alloc_cpu``:
``posix_memalign``, no huge-page advice unless ``THP_MEM_ALLOC_ENABLE`` is set), that is glibc's
``malloc``. Which sizes are fresh pages on every call (glibc ``malloc/malloc.c``; mallopt(3)
``M_MMAP_THRESHOLD``, "Note: Nowadays, glibc uses a dynamic mmap threshold"):

- a request whose chunk is at least the mmap threshold is a new anonymous ``mmap``
  (``sysmalloc``), unmapped again by ``free`` (``munmap_chunk``);
- the threshold starts at 128 KiB; ``free`` of a mapped chunk larger than the threshold and at
  most ``DEFAULT_MMAP_THRESHOLD_MAX`` (4 MiB x sizeof(long) = 32 MiB on 64-bit) raises it to
  that chunk's size (and the trim threshold to twice that), so it never exceeds 32 MiB;
- hence a temporary of 32 MiB or more is mapped afresh on every call, while a smaller one is
  mapped only until the first free of a mapped chunk at least its size, after which it comes
  from the heap, whose pages stay resident: offsim models the steady state, where only the
  temporaries of :data:`MMAP_THRESHOLD_MAX_BYTES` or more are fresh (:func:`fresh_bytes`).
  Setting ``M_MMAP_THRESHOLD`` (``mallopt`` or ``MALLOC_MMAP_THRESHOLD_``) turns the dynamic rule
  off; no validation case states that it was.

The pages of a fresh mapping are faulted in (and zeroed by the kernel) on first touch. Its rate is
a hardware-profile input, ``cpu.page_touch_gb_per_s``, one thread's rate: rapidsai/dask-cuda PR #98
(madsbk, 2019-08-01, a GV100 workstation) writes one element per page of a new 1 GiB
``numpy.empty`` in 0.3266 s (3.29 GB/s, the default), then the 1 GiB D2H into it runs at ~10 GB/s;
without that pre-touch the D2H takes 0.5479 s, the fault cost moved into the driver's copy. With
transparent huge pages set to ``always`` dask-cuda issue #106 (pentschev, 2019-08-02, a DGX-1)
reports host memory allocated at about 5 GB/s instead (validation/assumptions.yaml's range).
The CPU cast of a CPU->GPU copy runs on ATen's intra-op threads (``at::parallel_for``), which take
faults side by side: :func:`threaded_touch_bytes_per_s` scales the one-thread rate by the threads,
up to :data:`THREADED_TOUCH_SPEEDUP`, where measured population of one large mapping by several
threads saturates (kvcache-ai/Mooncake PRs #3939 and #3563; their mappings are memfd-backed shared
memory, whose faults also insert each page in the page cache: the nearest measurement found, not
the anonymous path itself). The driver's copy out of its staging buffer (GPU->CPU) is one thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from offsim.core.enums import Link, Res
from offsim.schedule.ops import Flow

#: glibc's largest dynamic mmap threshold on 64-bit (``malloc/malloc.c``
#: ``DEFAULT_MMAP_THRESHOLD_MAX`` = 4 * 1024 * 1024 * sizeof(long)): a request at least this large
#: is always a new mapping
MMAP_THRESHOLD_MAX_BYTES = 32 * 2**20


#: several threads of one process faulting in one large mapping, as a multiple of one thread's rate:
#: 3.1 -> 7.6 GB/s with 8 threads on one two-socket host (kvcache-ai/Mooncake PR #3939,
#: MADV_POPULATE_WRITE over disjoint chunks, 4 KiB pages, kernel 6.8), 1 GiB in 492 -> 179 ms
#: (2.75x) with 4 threads on another (PR #3563); the lower of the two, 7.6 / 3.1
THREADED_TOUCH_SPEEDUP = 7.6 / 3.1


def fresh_bytes(tensor_bytes: Iterable[float]) -> float:
    """Bytes of the host temporaries that are fresh mappings on every call: those of at least
    :data:`MMAP_THRESHOLD_MAX_BYTES` (smaller ones reuse the heap once the dynamic threshold has
    risen above them)."""
    return sum(b for b in tensor_bytes if b >= MMAP_THRESHOLD_MAX_BYTES)


def first_touch_s(nbytes: float, touch_bytes_per_s: float) -> float:
    """Seconds one thread spends faulting in ``nbytes`` of fresh pages at ``touch_bytes_per_s``
    (the profile's ``cpu.page_touch_bytes_per_s``)."""
    return nbytes / touch_bytes_per_s


def threaded_touch_bytes_per_s(one_thread_bytes_per_s: float, threads: float) -> float:
    """First-touch rate of ``threads`` threads writing one new mapping side by side, bytes/s:
    ``min(threads, THREADED_TOUCH_SPEEDUP)`` times one thread's (linear until the measured
    saturation, an assumption between 1 and 4 threads)."""
    return one_thread_bytes_per_s * min(max(threads, 1.0), THREADED_TOUCH_SPEEDUP)


def with_first_touch(flow: Flow, fresh: float, touch_bytes_per_s: float) -> Flow:
    """A pageable D2H whose destination holds ``fresh`` bytes of fresh pages: the host thread that
    copies out of the driver's staging buffer faults them in first (:func:`first_touch_s`), in
    series with the copy; the kernel zeroes each page (one more DRAM write per fresh byte)."""
    if fresh <= 0 or flow.nbytes <= 0:
        return flow
    seconds = flow.nbytes / flow.cap_bytes_per_s + first_touch_s(fresh, touch_bytes_per_s)
    usage = tuple((r, k + fresh / flow.nbytes) if r is Res.DRAM else (r, k) for r, k in flow.usage)
    return replace(flow, usage=usage, cap_bytes_per_s=flow.nbytes / seconds)


def touch_flow(fresh: int, touch_bytes_per_s: float) -> Flow:
    """The first touch of ``fresh`` bytes of a new host temporary that a CPU cast writes (the
    CPU->GPU case), as its own host pass in series with the cast: at most ``touch_bytes_per_s``,
    one DRAM write per byte (the kernel's zeroing)."""
    return Flow(fresh, ((Res.DRAM, 1.0),), touch_bytes_per_s, (Link.DRAM_COPY,))
