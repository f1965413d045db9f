"""CPU measurements: optimizer-step throughput, host memcpy bandwidth and first-touch page rate.

Optimizer: PyTorch's ``torch.optim.AdamW(foreach=True)`` on fp32 and DeepSpeed's
``DeepSpeedCPUAdam`` when importable (DeepSpeed's own perf test does the same comparison,
``tests/perf/adam_test.py``); without PyTorch a numpy AdamW (decoupled weight decay, the
same arithmetic as torch's) runs instead and the implementation name says so. The first step
(which allocates the moments) is not timed; the rate is the median over the timed steps.

memcpy: ``np.copyto`` between two buffers larger than the last-level cache, one thread and
one thread per CPU (numpy releases the GIL in copies). Rates count the bytes copied once;
the memory bus carries read + write, i.e. twice that (STREAM "copy" convention).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from typing import Any

import numpy as np

from offsim.calibrate.common import (
    CalibrationSettings,
    PartResult,
    Reporter,
    available_memory_bytes,
    cpu_facts,
    fmt_bytes,
    median,
)

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
ADAM_LR = 1e-3
ADAM_WD = 0.01


def _chunks(total: int, chunk: int) -> list[int]:
    sizes = [chunk] * (total // chunk)
    if total % chunk:
        sizes.append(total % chunk)
    return sizes


# ---------------------------------------------------------------------------------------------
# numpy AdamW


class NumpyAdamW:
    """AdamW over fp32 numpy arrays, in place, with one scratch buffer per array.

    Same update as ``torch.optim.AdamW``: ``p *= 1 - lr*wd``; ``m = b1 m + (1-b1) g``;
    ``v = b2 v + (1-b2) g^2``; ``p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)``.
    Arrays are updated in parallel over ``threads`` (numpy ufuncs release the GIL).
    """

    def __init__(
        self,
        params: list[np.ndarray],
        lr: float = ADAM_LR,
        betas: tuple[float, float] = ADAM_BETAS,
        eps: float = ADAM_EPS,
        weight_decay: float = ADAM_WD,
        threads: int = 1,
    ) -> None:
        self.params = params
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.tmp = [np.empty_like(p) for p in params]
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.threads = max(1, threads)
        self.step_count = 0

    def _update(self, i: int, grad: np.ndarray) -> None:
        p, m, v, tmp = self.params[i], self.m[i], self.v[i], self.tmp[i]
        b1, b2 = self.betas
        t = self.step_count
        p *= 1.0 - self.lr * self.wd
        m *= b1
        np.multiply(grad, 1.0 - b1, out=tmp)
        m += tmp
        v *= b2
        np.multiply(grad, grad, out=tmp)
        tmp *= 1.0 - b2
        v += tmp
        np.sqrt(v, out=tmp)
        tmp /= np.sqrt(1.0 - b2**t)
        tmp += self.eps
        np.divide(m, tmp, out=tmp)
        tmp *= self.lr / (1.0 - b1**t)
        p -= tmp

    def step(self, grads: list[np.ndarray]) -> None:
        """One AdamW step with ``grads`` (same shapes as the parameters)."""
        self.step_count += 1
        if self.threads == 1 or len(self.params) == 1:
            for i, g in enumerate(grads):
                self._update(i, g)
            return
        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(self._update, range(len(grads)), grads))


def measure_numpy_adamw(
    n_params: int, chunk: int, steps: int, threads: int, part: PartResult, rep: Reporter
) -> None:
    """params/s of :class:`NumpyAdamW` over ``n_params`` fp32 values in ``chunk``-sized arrays."""
    rng = np.random.default_rng(0)
    params = [rng.random(c, dtype=np.float32) for c in _chunks(n_params, chunk)]
    grads = [rng.random(c, dtype=np.float32) * np.float32(1e-3) for c in _chunks(n_params, chunk)]
    opt = NumpyAdamW(params, threads=threads)
    opt.step(grads)  # warm-up (first touch of the moments)
    _time_steps("numpy-adamw", lambda: opt.step(grads), n_params, steps, threads, part, rep)


def _time_steps(
    impl: str, step: Any, n_params: int, steps: int, threads: int, part: PartResult, rep: Reporter
) -> None:
    rows = part.rows("cpu")
    ts = []
    for r in range(steps):
        t0 = time.perf_counter()
        step()
        t = time.perf_counter() - t0
        ts.append(t)
        rows.append(
            {
                "kind": "optimizer",
                "impl": impl,
                "params": n_params,
                "threads": threads,
                "rep": r,
                "time_s": t,
                "params_per_s": n_params / t,
                "bytes": None,
                "gb_per_s": None,
            }
        )
    rep.say(
        f"[cpu] {impl}: {n_params / median(ts) / 1e6:.1f} M params/s "
        f"({fmt_bytes(n_params * 4)} fp32 params, {threads} threads)"
    )


# ---------------------------------------------------------------------------------------------
# PyTorch and DeepSpeed


def _torch_params(torch: Any, n_params: int, chunk: int) -> list[Any]:
    g = torch.Generator().manual_seed(0)
    params = []
    for c in _chunks(n_params, chunk):
        p = torch.nn.Parameter(torch.rand(c, generator=g))
        p.grad = torch.rand(c, generator=g) * 1e-3
        params.append(p)
    return params


def measure_torch_adamw(
    torch: Any, n_params: int, chunk: int, steps: int, part: PartResult, rep: Reporter
) -> None:
    """params/s of ``torch.optim.AdamW(foreach=True)`` on fp32 CPU tensors."""
    params = _torch_params(torch, n_params, chunk)
    opt = torch.optim.AdamW(
        params, lr=ADAM_LR, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=ADAM_WD, foreach=True
    )
    opt.step()  # warm-up: allocates exp_avg / exp_avg_sq
    _time_steps("torch-adamw-foreach", opt.step, n_params, steps, torch.get_num_threads(), part, rep)


def load_deepspeed_cpu_adam() -> tuple[Any, str | None]:
    """``(DeepSpeedCPUAdam, None)`` or ``(None, why)``."""
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # type: ignore[import-not-found]
    except Exception as exc:  # ImportError, or a broken build
        return None, f"{type(exc).__name__}: {exc}".splitlines()[0]
    return DeepSpeedCPUAdam, None


def measure_deepspeed_adam(
    torch: Any, cls: Any, n_params: int, chunk: int, steps: int, part: PartResult, rep: Reporter
) -> None:
    """params/s of DeepSpeed's CPU-Adam in AdamW mode on fp32 CPU tensors."""
    params = _torch_params(torch, n_params, chunk)
    opt = cls(params, lr=ADAM_LR, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=ADAM_WD, adamw_mode=True)
    opt.step()
    _time_steps("deepspeed-cpu-adam", opt.step, n_params, steps, torch.get_num_threads(), part, rep)


# ---------------------------------------------------------------------------------------------
# memcpy


def measure_memcpy(nbytes: int, repeats: int, threads: int, part: PartResult, rep: Reporter) -> None:
    """``np.copyto`` of ``nbytes`` with one thread, then with ``threads`` threads on slices."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)  # zeros may map lazily: the warm-up copy touches it
    rows = part.rows("cpu")
    counts = [1] if threads <= 1 else [1, threads]
    for nt in counts:
        bounds = np.linspace(0, nbytes, nt + 1, dtype=np.int64)
        slices = [slice(int(a), int(b)) for a, b in pairwise(bounds)]
        pool = ThreadPoolExecutor(nt) if nt > 1 else None
        try:

            def copy(pool: ThreadPoolExecutor | None = pool, slices: list[slice] = slices) -> None:
                if pool is None:
                    np.copyto(dst, src)
                else:
                    list(pool.map(lambda s: np.copyto(dst[s], src[s]), slices))

            copy()  # warm-up: page faults, thread start
            ts = []
            for r in range(repeats):
                t0 = time.perf_counter()
                copy()
                t = time.perf_counter() - t0
                ts.append(t)
                rows.append(
                    {
                        "kind": "memcpy",
                        "impl": "numpy-copyto",
                        "params": None,
                        "threads": nt,
                        "rep": r,
                        "time_s": t,
                        "params_per_s": None,
                        "bytes": nbytes,
                        "gb_per_s": nbytes / t / 1e9,
                    }
                )
        finally:
            if pool is not None:
                pool.shutdown()
        rep.say(f"[cpu] memcpy {fmt_bytes(nbytes)} with {nt} thread(s): {nbytes / median(ts) / 1e9:.2f} GB/s")


#: Above glibc's largest dynamic mmap threshold (32 MiB on 64-bit, mallopt(3)), so every
#: ``np.empty`` of this size is a fresh mapping whose pages fault on first touch.
PAGE_TOUCH_MIN_BYTES = 64 * 2**20


def measure_page_touch(nbytes: int, repeats: int, part: PartResult, rep: Reporter) -> None:
    """First touch of fresh pageable pages by one thread (``cpu.page_touch_gb_per_s``,
    :mod:`offsim.plan.host_pages`): a fresh ``np.empty`` of at least :data:`PAGE_TOUCH_MIN_BYTES`
    filled once (page faults and writes), then again (writes alone); the touch time is the
    difference."""
    nbytes = max(nbytes, PAGE_TOUCH_MIN_BYTES)
    rows = part.rows("cpu")
    ts: list[float] = []
    with _small_pages():
        _touch_rows(nbytes, repeats, rows, ts)
    rep.say(f"[cpu] first touch of {fmt_bytes(nbytes)} of fresh 4 KiB pages, one thread: "
            f"{nbytes / median(ts) / 1e9:.2f} GB/s")


@contextlib.contextmanager
def _small_pages() -> Iterator[None]:
    """numpy asks for transparent huge pages on large arrays (``madvise(MADV_HUGEPAGE)``);
    PyTorch's CPU allocator does not by default (``THP_MEM_ALLOC_ENABLE`` unset), so the
    measurement turns it off, as the tensors it prices are allocated."""
    import importlib

    try:
        multiarray = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # numpy < 2
        multiarray = importlib.import_module("numpy.core.multiarray")
    set_hugepage = multiarray._set_madvise_hugepage
    previous = set_hugepage(False)
    try:
        yield
    finally:
        set_hugepage(previous)


def _touch_rows(nbytes: int, repeats: int, rows: list[dict[str, Any]], ts: list[float]) -> None:
    for r in range(repeats):
        buf = np.empty(nbytes, dtype=np.uint8)
        t0 = time.perf_counter()
        buf.fill(1)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        buf.fill(2)
        t = max(first - (time.perf_counter() - t0), 1e-9)
        del buf
        ts.append(t)
        rows.append({"kind": "page_touch", "impl": "numpy-fill", "params": None, "threads": 1, "rep": r,
                     "time_s": t, "params_per_s": None, "bytes": nbytes, "gb_per_s": nbytes / t / 1e9})


# ---------------------------------------------------------------------------------------------
# The part


def _load_torch() -> tuple[Any, str | None]:
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    except Exception as exc:
        return None, f"importing torch failed ({type(exc).__name__}: {exc})"
    return torch, None


def run_cpu_part(settings: CalibrationSettings, rep: Reporter) -> PartResult:
    """Optimizer step throughput and memcpy bandwidth."""
    part = PartResult("cpu")
    facts = cpu_facts()
    part.info = {"cpu": facts}
    threads = settings.memcpy_threads or facts.get("affinity_cpus") or os.cpu_count() or 1
    n = _optimizer_params(settings, part, rep)
    chunk = min(settings.cpu_optimizer_chunk, n)
    steps = _optimizer_steps(settings, n, chunk, threads, part, rep)
    steps.append(
        ("memcpy", lambda: measure_memcpy(settings.memcpy_bytes, settings.memcpy_repeats, threads, part, rep))
    )
    steps.append(("page touch", lambda: measure_page_touch(settings.memcpy_bytes, settings.memcpy_repeats, part, rep)))
    for name, step in steps:
        try:
            step()
        except Exception as exc:
            part.degrade()
            rep.warn(f"CPU {name} measurement failed: {type(exc).__name__}: {exc}", part)
    if not part.rows("cpu"):
        part.status = "failed"
    return part


def _optimizer_params(settings: CalibrationSettings, part: PartResult, rep: Reporter) -> int:
    """Parameters to time the optimizer on: the setting, or fewer when free host memory is short."""
    n = settings.cpu_optimizer_params
    avail = available_memory_bytes()
    if avail is not None and n * 20 > 0.5 * avail:  # param + grad + 2 moments + scratch, fp32
        n2 = max(settings.cpu_optimizer_chunk, int(0.5 * avail / 20))
        rep.warn(
            f"CPU optimizer measured on {n2:,} parameters instead of {n:,}: not enough free host memory", part
        )
        n = n2
    return n


def _optimizer_steps(
    settings: CalibrationSettings, n: int, chunk: int, threads: int, part: PartResult, rep: Reporter
) -> list[tuple[str, Any]]:
    """The optimizer measurements to run: torch AdamW (and DeepSpeed CPU-Adam), else a numpy AdamW."""
    torch, why = _load_torch()
    if torch is None:
        rep.warn(
            f"CPU optimizer: {why}; measuring a numpy AdamW instead (optimizer_impl 'numpy-adamw', "
            "slower than torch or DeepSpeed CPU-Adam)",
            part,
        )
        return [("numpy AdamW",
                 lambda: measure_numpy_adamw(n, chunk, settings.cpu_optimizer_steps, threads, part, rep))]
    part.info["torch_threads"] = torch.get_num_threads()
    with contextlib.suppress(Exception):
        part.info["simd"] = torch.backends.cpu.get_cpu_capability()
    if settings.cpu_threads:
        torch.set_num_threads(settings.cpu_threads)
    steps: list[tuple[str, Any]] = [
        ("torch AdamW", lambda: measure_torch_adamw(torch, n, chunk, settings.cpu_optimizer_steps, part, rep))
    ]
    if settings.try_deepspeed:
        cls, ds_why = load_deepspeed_cpu_adam()
        if cls is None:
            part.info["deepspeed_cpu_adam"] = f"not measured ({ds_why})"
            rep.say(f"[cpu] DeepSpeed CPU-Adam not measured ({ds_why})")
        else:
            steps.append(("DeepSpeed CPU-Adam", lambda: measure_deepspeed_adam(
                torch, cls, n, chunk, settings.cpu_optimizer_steps, part, rep)))
    return steps
