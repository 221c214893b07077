"""Where a command computes and in what precision, decided once where the command starts.

Every command that loads a model (and ``spa run``, once for all its stages) calls
:func:`decide` with its ``--device`` and ``--precision`` (a recipe's ``device`` and
``precision``) before any model loads, and passes the :class:`Compute` it returns down to
the loaders, trainers and the generation engine. Below the entry point nothing reads the
two strings again: a stage that resolved ``auto`` on its own could land on another device
or precision than the command announced.

The device names:

* ``auto`` (the default): a CUDA GPU where torch sees one, else the CPU;
* ``cpu``;
* ``cuda``: the current GPU (``cuda:0`` unless set otherwise);
* ``cuda:N``: GPU N among those ``CUDA_VISIBLE_DEVICES`` shows.

Under a launcher (``accelerate launch``, ``torchrun``: ``LOCAL_RANK`` is set) each process
owns one GPU, so ``auto`` and ``cuda`` mean ``cuda:LOCAL_RANK``, and a ``cuda:N`` naming
another card is an error (the processes would share it). :func:`decide` makes a GPU the
current one (``torch.cuda.set_device``) before any model loads, as accelerate does when
its process group starts; ``cpu`` under a launcher sets ``ACCELERATE_USE_CPU``, so that
the processes talk over gloo and keep their models on the CPU (:mod:`spa.distributed`
reads it) even on a GPU machine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch

from spa import precision as precision_
from spa.precision import Precision

DEVICES = ("auto", "cpu", "cuda", "cuda:N")
FIELD_HELP = ("Device: auto (a CUDA GPU where torch sees one, else the CPU; under a launcher the GPU of the "
              "process's LOCAL_RANK), cpu, cuda (the current GPU) or cuda:N (GPU N).")
_INDEXED = re.compile(r"cuda:(\d+)")


def check_device(name: str | torch.device) -> str:
    """The canonical name of a device (``auto``, ``cpu``, ``cuda``, ``cuda:N``), or a
    ValueError naming it and what is allowed."""
    key = str(name).strip().lower()
    if key in DEVICES[:3]:
        return key
    if match := _INDEXED.fullmatch(key):
        return f"cuda:{int(match.group(1))}"
    raise ValueError(f"device {str(name)!r} is not known; valid: auto, cpu, cuda, cuda:N (N a GPU index: 0, 1, ...)")


def local_rank() -> int | None:
    """This process's ``LOCAL_RANK`` under a launcher, else None."""
    rank = os.environ.get("LOCAL_RANK", "")
    return int(rank) if rank.strip() else None


def accelerate_cpu() -> bool:
    """accelerate's switch for CPU processes (``accelerate launch --cpu``, or set by :func:`claim`)."""
    return os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """The torch device ``name`` means in this process (module docstring); a ValueError
    where it names a GPU that torch does not see."""
    name = check_device(name)
    cuda = torch.cuda.is_available()
    if name == "cpu" or (name == "auto" and (not cuda or accelerate_cpu())):
        return torch.device("cpu")
    if not cuda:
        raise ValueError(f"device {name!r} was asked for, but torch sees no CUDA GPU here; valid here: auto, cpu")
    rank, count = local_rank(), torch.cuda.device_count()
    if name.startswith("cuda:"):
        index = int(name.removeprefix("cuda:"))
        if rank is not None and index != rank:
            raise ValueError(f"device {name!r} under a launcher: each process takes the GPU of its LOCAL_RANK "
                             f"(cuda:{rank} here); use auto or cuda")
    else:
        index = rank if rank is not None else torch.cuda.current_device()
    if index >= count:
        why = f"LOCAL_RANK={rank} asks for cuda:{index}" if rank is not None and name in ("auto", "cuda") \
            else f"device {name!r} was asked for"
        raise ValueError(f"{why}, but torch sees {count} GPU(s): cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)


@dataclass(frozen=True)
class Compute:
    """A decided device and precision, handed from a command's start to everything below it."""

    device: torch.device
    precision: Precision

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the precision (the dtype a player loads its weights in)."""
        return self.precision.dtype

    @property
    def decode_dtype(self) -> torch.dtype | None:
        """The dtype the engine decodes fp32 master weights in (None: as they are)."""
        return self.precision.decode_dtype

    def autocast(self, device: torch.device | str | None = None):
        """Autocast to the precision on ``device`` (default: this one); fp32: a no-op context."""
        return self.precision.autocast(self.device if device is None else device)

    def with_precision(self, name: str) -> Compute:
        """The same device in precision ``name`` (a stage whose own precision differs from its
        run's), announced."""
        chosen = Compute(self.device, precision_.resolve(name, self.device))
        announce(chosen)
        return chosen


def claim(device: torch.device) -> None:
    """Make ``device`` this process's before any model loads: the current GPU, or, for the
    CPU under a launcher, accelerate's CPU switch (module docstring)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif local_rank() is not None:
        os.environ["ACCELERATE_USE_CPU"] = "true"


def announce(compute: Compute, file=None) -> None:
    """``compute: bf16 on cuda:0 (this GPU supports bf16)``, once per process (and the
    warning of a slow explicit precision)."""
    precision_.announce(compute.precision, file, where=f" on {compute.device}")


def decide(device: str | torch.device = "auto", precision_name: str = "auto") -> Compute:
    """Resolve ``device`` and ``precision_name`` for this process, :func:`claim` the device
    and :func:`announce` the choice: what a command calls once, before it loads a model.
    A bad name of either is a ValueError naming it and what is allowed."""
    precision_name = precision_.check(precision_name)
    where = resolve_device(device)
    chosen = Compute(where, precision_.resolve(precision_name, where))
    claim(where)
    announce(chosen)
    return chosen


def for_model(model: torch.nn.Module, precision_name: str = "auto") -> Compute:
    """The compute of a model already placed: its parameters' device, ``precision_name``
    resolved there (announced). For a caller that hands a trainer no :class:`Compute` of
    its own (a script calling the library)."""
    where = next(model.parameters()).device
    chosen = Compute(where, precision_.resolve(precision_name, where))
    announce(chosen)
    return chosen
