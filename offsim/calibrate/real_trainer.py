"""A real offloaded training loop in PyTorch, ZeRO-Infinity-CPU style, timed per phase.

What it does (the ``zero-infinity-cpu`` strategy, strategies/zero-infinity-cpu.yaml):

* Each layer's 16-bit parameters, 16-bit gradients and fp32 master weights and AdamW moments
  live in (pinned, on CUDA) CPU memory. The GPU holds one flat 16-bit buffer per layer whose
  storage is allocated only while the layer is in use: parameters are views into it, and the
  storage is resized to 0 bytes to release it (what FSDP does with its flat parameters).
* Forward: layer ``i+1``'s parameters are copied to the GPU on a side stream while layer ``i``
  computes (prefetch depth 1); a layer's parameters are released after its forward, except the
  last layer's, which backward needs next (``stage3_max_reuse_distance`` keeps it).
* Backward runs layer by layer (each layer's forward graph is kept on the GPU, no
  recomputation): parameters are fetched again, one layer ahead; after a layer's backward its
  gradients are copied to pinned CPU buffers on a second side stream and its parameters and
  gradients released.
* Optimizer: ``torch.optim.AdamW(foreach=True)`` on the CPU over the fp32 master weights (the
  16-bit gradients upcast first); the updated weights are cast back into the pinned 16-bit copy.

On ``device='cpu'`` there are no streams and no pinning, but every other step (flat buffers,
storage release, per-layer backward, gradient copy-out, CPU optimizer) is the same, so tests can
exercise the mechanics. The model is a stack of :class:`offsim.calibrate.torch_block.Block`
with no embedding or head; the loss is ``mean(out**2)`` on random input.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

ADAMW = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


@dataclass(frozen=True)
class RealShape:
    """Shape of the real model: ``layers`` blocks of width ``hidden``, batch x sequence."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    ffn_hidden: int = 256
    seq_len: int = 32
    micro_batch: int = 1

    @classmethod
    def from_workload(cls, workload: Any, layers: int | None = None) -> RealShape:
        """Take the shape of an offsim ``Workload`` (optionally fewer layers)."""
        m, t = workload.model, workload.training
        return cls(
            layers=layers or m.layers,
            hidden=m.hidden,
            heads=m.heads,
            ffn_hidden=m.ffn_hidden,
            seq_len=t.seq_len,
            micro_batch=t.micro_batch,
        )


def build_blocks(shape: RealShape, seed: int = 0) -> list[Any]:
    """The model's blocks, fp32 on the CPU, initialised from ``seed`` (same seed, same weights)."""
    import torch

    from offsim.calibrate.torch_block import Block

    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return [Block(shape.hidden, shape.heads, shape.ffn_hidden) for _ in range(shape.layers)]
    finally:
        torch.random.set_rng_state(gen_state)


def make_input(shape: RealShape, seed: int = 1) -> Any:
    """Random fp32 CPU input of ``(micro_batch, seq_len, hidden)``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape.micro_batch, shape.seq_len, shape.hidden, generator=g)


class _Layer:
    """One layer's host state and its GPU flat buffer."""

    def __init__(self, torch: Any, block: Any, device: Any, dtype: Any, pin: bool) -> None:
        params = list(block.parameters())
        self.shapes = [p.shape for p in params]
        self.sizes = [p.numel() for p in params]
        n = sum(self.sizes)
        self.numel = n
        flat32 = torch.cat([p.detach().reshape(-1).float() for p in params])
        self.master = torch.nn.Parameter(torch.empty(n, dtype=torch.float32, pin_memory=pin))
        self.master.data.copy_(flat32)
        self.master.grad = torch.zeros(n, dtype=torch.float32)
        self.host16 = torch.empty(n, dtype=dtype, pin_memory=pin)
        self.host16.copy_(flat32)
        self.grad16 = torch.zeros(n, dtype=dtype, pin_memory=pin)
        self.block = block.to(device=device, dtype=dtype)
        self.params = list(self.block.parameters())
        self.gbuf = torch.empty(n, dtype=dtype, device=device)
        off = 0
        for p, size, shp in zip(self.params, self.sizes, self.shapes, strict=True):
            p.data = self.gbuf[off : off + size].view(shp)
            off += size
        self.nbytes = self.gbuf.untyped_storage().nbytes()
        self.gbuf.untyped_storage().resize_(0)
        self.resident = False
        self.ready: Any = None


class OffloadedTrainer:
    """Parameters and optimizer state on the host, streamed through the GPU layer by layer.

    Args:
        shape: model shape.
        device: ``'cuda'`` (streams, pinned memory) or ``'cpu'`` (mechanics only).
        dtype: compute/parameter dtype name (``bf16``, ``fp16``, ``fp32``); default bf16 on
            CUDA, fp32 on the CPU.
        seed: weight initialisation seed (see :func:`build_blocks`).
        keep_last: keep the last layer's parameters from forward into backward.
    """

    def __init__(
        self,
        shape: RealShape,
        device: str = "cuda",
        dtype: str | None = None,
        seed: int = 0,
        keep_last: bool = True,
        adamw: dict[str, Any] | None = None,
    ) -> None:
        import torch

        self.torch = torch
        self.shape = shape
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
        dname = dtype or ("bf16" if self.cuda else "fp32")
        self.dtype_name = dname
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dname]
        self.keep_last = keep_last
        self.layers = [
            _Layer(torch, b, self.device, self.dtype, self.cuda) for b in build_blocks(shape, seed)
        ]
        hp = dict(ADAMW, **(adamw or {}))
        self.optimizer = torch.optim.AdamW([layer.master for layer in self.layers], foreach=True, **hp)
        for layer in self.layers:  # optimizer state in pinned host memory, created up front
            self.optimizer.state[layer.master] = {
                "step": torch.tensor(0.0, dtype=torch.float32),
                "exp_avg": torch.zeros(layer.numel, dtype=torch.float32, pin_memory=self.cuda),
                "exp_avg_sq": torch.zeros(layer.numel, dtype=torch.float32, pin_memory=self.cuda),
            }
        if self.cuda:
            self.compute = torch.cuda.current_stream(self.device)
            self.h2d = torch.cuda.Stream(self.device)
            self.d2h = torch.cuda.Stream(self.device)
        self._acts: list[tuple[Any, Any]] = []

    @property
    def params(self) -> int:
        """Parameters of the model."""
        return sum(layer.numel for layer in self.layers)

    # -- parameter movement -------------------------------------------------------------------
    def _fetch(self, i: int) -> None:
        """Allocate layer ``i``'s GPU buffer and start copying its parameters in."""
        layer = self.layers[i]
        if layer.resident:
            return
        torch = self.torch
        layer.gbuf.untyped_storage().resize_(layer.nbytes)  # allocated in the compute stream's order
        if self.cuda:
            allocated = torch.cuda.Event()
            allocated.record(self.compute)
            self.h2d.wait_event(allocated)  # the memory may have been in use by earlier kernels
            with torch.cuda.stream(self.h2d):
                layer.gbuf.copy_(layer.host16, non_blocking=True)
                layer.ready = torch.cuda.Event()
                layer.ready.record(self.h2d)
        else:
            layer.gbuf.copy_(layer.host16)
        layer.resident = True

    def _wait(self, i: int) -> None:
        layer = self.layers[i]
        if self.cuda and layer.ready is not None:
            self.compute.wait_event(layer.ready)

    def _release(self, i: int) -> None:
        layer = self.layers[i]
        layer.gbuf.untyped_storage().resize_(0)
        layer.resident = False
        layer.ready = None

    def _offload_grads(self, i: int) -> None:
        layer = self.layers[i]
        torch = self.torch
        grads = [p.grad for p in layer.params]
        if self.cuda:
            done = torch.cuda.Event()
            done.record(self.compute)
            self.d2h.wait_event(done)
            with torch.cuda.stream(self.d2h):
                off = 0
                for g, size in zip(grads, layer.sizes, strict=True):
                    layer.grad16[off : off + size].copy_(g.reshape(-1), non_blocking=True)
                    g.record_stream(self.d2h)  # keep the memory until the copy is done
                    off += size
        else:
            torch.cat([g.reshape(-1) for g in grads], out=layer.grad16)
        for p in layer.params:
            p.grad = None

    # -- phases ---------------------------------------------------------------------------------
    def forward(self, x: Any) -> Any:
        """Forward through every layer with prefetch depth 1; returns the loss."""
        n = len(self.layers)
        self._acts = []
        h = x
        self._fetch(0)
        for i in range(n):
            if i + 1 < n:
                self._fetch(i + 1)
            self._wait(i)
            inp = h.detach().requires_grad_(True)
            out = self.layers[i].block(inp)
            self._acts.append((inp, out))
            h = out
            if not (self.keep_last and i == n - 1):
                self._release(i)
        return h.float().pow(2).mean()

    def backward(self, loss: Any) -> None:
        """Backward layer by layer, fetching one layer ahead and copying gradients out."""
        torch = self.torch
        grad = torch.autograd.grad(loss, self._acts[-1][1])[0]
        for i in reversed(range(len(self.layers))):
            self._fetch(i)
            if i > 0:
                self._fetch(i - 1)
            self._wait(i)
            inp, out = self._acts[i]
            torch.autograd.backward(out, grad)
            grad = inp.grad
            self._offload_grads(i)
            self._release(i)
        self._acts = []

    def optimizer_step(self) -> None:
        """CPU AdamW over the fp32 masters; the result is cast into the 16-bit host copy."""
        for layer in self.layers:
            layer.master.grad.copy_(layer.grad16)
        self.optimizer.step()
        for layer in self.layers:
            layer.host16.copy_(layer.master.detach())

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def iteration(self, x: Any) -> dict[str, float]:
        """One training step; wall-clock seconds per phase (GPU work synchronised)."""
        t0 = time.perf_counter()
        loss = self.forward(x)
        self._sync()
        t1 = time.perf_counter()
        self.backward(loss)
        self._sync()
        t2 = time.perf_counter()
        self.optimizer_step()
        t3 = time.perf_counter()
        return {
            "forward_s": t1 - t0,
            "backward_s": t2 - t1,
            "optimizer_s": t3 - t2,
            "iteration_s": t3 - t0,
            "loss": float(loss.detach()),
        }

    def master_params(self) -> list[Any]:
        """The fp32 master weights, one flat tensor per layer (parameter order of the block)."""
        return [layer.master.detach() for layer in self.layers]


def run_real_training(
    shape: RealShape | None = None,
    *,
    device: str = "cuda",
    iterations: int = 5,
    warmup: int = 1,
    dtype: str | None = None,
    seed: int = 0,
    keep_last: bool = True,
) -> dict[str, Any]:
    """Run ``warmup + iterations`` offloaded training steps; phase times of the timed ones.

    Returns:
        ``forward_s``, ``backward_s``, ``optimizer_s``, ``iteration_s`` and ``loss``: one
        entry per timed iteration; plus ``device``, ``dtype``, ``params``, ``shape``,
        ``pinned``, ``prefetch_depth`` (1), ``keep_last_layer``, ``torch``.
    """
    import torch

    shape = shape or RealShape()
    trainer = OffloadedTrainer(shape, device=device, dtype=dtype, seed=seed, keep_last=keep_last)
    x = make_input(shape).to(device=trainer.device, dtype=trainer.dtype)
    out: dict[str, Any] = {k: [] for k in ("forward_s", "backward_s", "optimizer_s", "iteration_s", "loss")}
    for i in range(warmup + iterations):
        res = trainer.iteration(x)
        if i >= warmup:
            for k, v in res.items():
                out[k].append(v)
    out.update(
        {
            "device": str(trainer.device),
            "dtype": trainer.dtype_name,
            "params": trainer.params,
            "shape": asdict(shape),
            "pinned": trainer.cuda,
            "prefetch_depth": 1,
            "keep_last_layer": keep_last,
            "iterations": iterations,
            "warmup": warmup,
            "torch": torch.__version__,
        }
    )
    return out
