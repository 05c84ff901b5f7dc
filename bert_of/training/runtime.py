"""Where a run's tensors live: one process, several ranks with global tensors, or eager DDP.

Data parallel with global tensors: parameters ``broadcast`` over ``flow.placement(device,
ranks)``, every batch ``split(0)`` (each rank contributes its own rows). Eager DDP: local
tensors, each rank its own rows, gradients all-reduced by DDP's hooks.

Importing this module loads no OneFlow: ``Runtime()`` (one CPU process, rank 0 of 1) is what
``--engine onnxruntime`` runs with, without it; :meth:`Runtime.create` and the methods that place
or make tensors load OneFlow (:func:`_flow`) when first called.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bert_of.errors import ConfigError

DISTS = ("auto", "global", "ddp", "none")


def _flow():
    """OneFlow (bert_of's door to it), imported on first use."""
    from bert_of._flow import flow

    return flow


@dataclass
class Runtime:
    device: str = "cpu"
    world: int = 1
    rank: int = 0
    placement: object = None  # global tensors over these ranks
    ddp: bool = False  # eager data parallelism with local tensors

    @classmethod
    def create(cls, device: str | None = None, dist: str = "auto") -> "Runtime":
        """device: cpu, cuda, or None / "auto" (cuda when OneFlow sees a GPU). dist: "auto" (global
        tensors when launched on several ranks), "global" (always, also on one rank), "ddp"
        (eager DDP), "none" (local tensors, one process)."""
        flow = _flow()
        world, rank = flow.env.get_world_size(), flow.env.get_rank()
        if device in (None, "auto"):
            device = "cuda" if flow.cuda.is_available() else "cpu"
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"--device {device!r}: expected cpu, cuda or auto")
        if device == "cuda" and not flow.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is available to OneFlow")
        if dist not in DISTS:
            raise ConfigError(f"distribution {dist!r}: expected one of {', '.join(DISTS)}")
        if dist == "none" and world > 1:
            raise ConfigError(f"local tensors in one process, but {world} ranks were launched")
        glob = dist == "global" or (dist == "auto" and world > 1)
        placement = flow.placement(device, ranks=list(range(world))) if glob else None
        return cls(device, world, rank, placement, ddp=dist == "ddp" and world > 1)

    def mode(self, mode: str, job: str) -> str:
        """``--mode auto`` made concrete for ``job`` (pretrain, finetune or predict): eager under DDP,
        which has no graph; nn.Graph on CUDA; on CPU, the one measured faster there
        (bench/pretrain_bench.py, bench/infer_bench.py; figures in docs/benchmarks.md): nn.Graph for
        pretraining, eager for fine-tuning (the graph's CPU memory bound splits steps into
        micro-batches) and prediction, each at less memory than the graph."""
        if job not in ("pretrain", "finetune", "predict"):
            raise ValueError(f"job {job!r}: expected pretrain, finetune or predict")
        if mode != "auto":
            return mode
        if self.ddp:
            return "eager"
        return "graph" if self.device != "cpu" or job == "pretrain" else "eager"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def local_device(self):
        flow = _flow()
        if self.device == "cuda":
            return flow.device("cuda", flow.env.get_local_rank() if self.world > 1 else 0)
        return flow.device("cpu")

    def place(self, model):
        """Parameters broadcast over the placement, or on this process's device."""
        if self.placement is not None:
            model.to_global(placement=self.placement, sbp=_flow().sbp.broadcast)
        elif self.device != "cpu":
            model.to(self.local_device)
        return model

    def rank_rows(self, arr: np.ndarray) -> np.ndarray:
        """This rank's rows of a global batch (all of them in one process)."""
        if self.world == 1:
            return arr
        n = len(arr)
        return arr[self.rank * n // self.world:(self.rank + 1) * n // self.world]

    def tensor(self, arr: np.ndarray):
        """This rank's rows (numpy) as an input tensor: float32 or int64, local or global split(0)."""
        flow = _flow()
        dtype = flow.float32 if arr.dtype.kind == "f" else flow.int64
        t = flow.tensor(np.ascontiguousarray(arr), dtype=dtype, device=self.local_device)
        if self.placement is not None:
            t = t.to_global(placement=self.placement, sbp=flow.sbp.split(0))
        return t

    def barrier(self) -> None:
        if self.world > 1:
            _flow().comm.barrier()


def to_numpy(t) -> np.ndarray:
    """A tensor as numpy; a global one gathered whole on every rank (a collective)."""
    from bert_of.model_io import to_local_full  # the model layer (OneFlow): a tensor exists, so it is loaded

    return to_local_full(t).numpy()


def scalar(t) -> float:
    """A (global or local) scalar tensor as a float."""
    return float(to_numpy(t).reshape(-1).mean())
