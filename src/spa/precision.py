"""The compute precision: one place decides it for a device.

Why a decision at all: bf16 is the fast precision only where the hardware computes it.
On a CPU with AVX512_BF16 or AMX (AMD Zen 4, Intel Sapphire Rapids and later) a bf16
matmul runs about 4x fp32; on a CPU without (AVX2 machines, Intel laptops, AMD before
Zen 4) torch emulates it and the same matmul runs about 100x *slower* than fp32
(measured on a 2-core Zen 3: 1.2 against 115 GFLOP/s). So ``auto`` picks:

* CUDA: bf16 where the GPU supports it, else fp32;
* CPU: bf16 where the CPU has native bf16 and torch's kernels use AVX-512 (so
  ``ATEN_CPU_CAPABILITY=avx2`` behaves as an AVX2 machine), else fp32.

An explicit ``bf16`` / ``fp16`` / ``fp32`` is obeyed; a low precision this CPU only
emulates gets a one-line warning. A command decides the precision once, with its device,
where it starts (:func:`spa.compute.decide`), and reports the choice once (:func:`announce`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_announced: set[str] = set()


@dataclass(frozen=True)
class Precision:
    """A resolved precision: its name, torch dtype, and why it was chosen."""

    name: str  # bf16 | fp16 | fp32
    reason: str
    warning: str = ""  # non-empty when an explicit choice is slow on this hardware

    @property
    def dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.name]

    @property
    def low(self) -> bool:
        """True for bf16/fp16: fp32 master weights compute under autocast, decode in this dtype."""
        return self.name != "fp32"

    def autocast(self, device: torch.device | str):
        """Autocast to this precision on ``device`` (a no-op context for fp32)."""
        if not self.low:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=self.dtype)

    @property
    def decode_dtype(self) -> torch.dtype | None:
        """The dtype the generation engine decodes fp32 master weights in (None: as they are)."""
        return self.dtype if self.low else None


def check(name: str) -> str:
    """The canonical name of a precision, or a ValueError naming it and what is allowed."""
    key = str(name).lower()
    key = _ALIASES.get(key, key)
    if key not in PRECISIONS:
        raise ValueError(f"precision {name!r} is not known; valid: {', '.join(PRECISIONS)}")
    return key


def cpu_capability() -> str:
    """torch's vector ISA for CPU kernels (``AVX512``, ``AVX2``, ``DEFAULT``...)."""
    return torch.backends.cpu.get_cpu_capability()


def cpu_has_native_bf16() -> bool:
    """True where bf16 matmuls run in hardware: AVX512_BF16 or AMX, with AVX-512 kernels."""
    if cpu_capability() != "AVX512":
        return False
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def cuda_has_bf16(device: torch.device) -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def resolve(name: str = "auto", device: torch.device | str = "cpu") -> Precision:
    """Decide the precision for ``device`` (see the module docstring)."""
    name = check(name)
    device = torch.device(device)
    if device.type == "cuda":
        native = cuda_has_bf16(device)
        hardware = "this GPU" + (" supports bf16" if native else " has no bf16")
        slow = {"bf16": not native}
    else:
        native = cpu_has_native_bf16()
        hardware = f"this CPU ({cpu_capability()}) " + ("has native bf16" if native else "has no native bf16")
        # fp16 on a CPU without AMX-FP16 is emulated too (as slow as bf16 here).
        slow = {"bf16": not native, "fp16": not torch.cpu._is_amx_fp16_supported()}
    if name == "auto":
        return Precision("bf16" if native else "fp32", hardware)
    warning = ""
    if slow.get(name):
        warning = (f"{name} was asked for, but {hardware}: it is emulated and can be 10-100x slower than "
                   f"fp32 (use --precision auto or fp32, or precision: auto in a recipe)")
    return Precision(name, "asked for", warning)


def announce(precision: Precision, file=None, where: str = "") -> None:
    """Print ``compute: fp32 (this CPU ... has no native bf16)`` once, and the warning of a
    slow explicit choice; ``where`` goes after the name (`` on cpu``). Under a launcher only
    the first process prints (``RANK``, set by torchrun and accelerate launch, is 0)."""
    line = f"compute: {precision.name}{where} ({precision.reason})"
    if line in _announced or os.environ.get("RANK", "0") != "0":
        return
    _announced.add(line)
    out = file or sys.stderr
    print(line, file=out)
    if precision.warning:
        print(f"warning: {precision.warning}", file=out)


def decide(name: str = "auto", device: torch.device | str = "cpu") -> Precision:
    """:func:`resolve`, then :func:`announce` the choice (once per process): for a script
    that picks its device itself (``bench/``); the commands decide the device and the
    precision together (:func:`spa.compute.decide`)."""
    chosen = resolve(name, device)
    announce(chosen)
    return chosen


FIELD_HELP = ("Compute precision: auto (bf16 where the hardware computes it natively: a GPU with bf16, a CPU "
              "with AVX512_BF16 or AMX; fp32 elsewhere, where bf16 is emulated and about 100x slower), bf16, "
              "fp16 or fp32. Weights stay fp32; autocast and sampling use this precision.")
RENAMED_BF16 = ("bf16", ("precision", "bf16: true is now precision: bf16, bf16: false is precision: fp32; "
                                      "the default precision: auto picks what this hardware runs fast"))
