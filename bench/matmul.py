"""Matmul throughput of this machine in each precision, and what ``auto`` picks, as JSON.

Whether bf16 is worth using depends on the CPU alone: where the hardware computes it
(AVX512_BF16 or AMX) a bf16 matmul runs several times fp32, elsewhere torch emulates it
and it runs about 100x slower. This measures a square matmul in fp32, bf16 and fp16 and
prints GFLOP/s beside ``spa.precision``'s choice, so a user can see which kind of machine
they have before a long run.

    python bench/matmul.py                  # 2048 x 2048, every precision
    python bench/matmul.py --size 1024 --dtypes fp32 bf16

An emulated precision can take minutes at 2048 (about 15 s a product at 1.2 GFLOP/s):
each precision is timed for at least ``--seconds`` (default 2) or one product, whichever
is longer, after one untimed warm-up product.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from spa import precision

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def gflops(size: int, dtype: torch.dtype, seconds: float) -> float:
    """GFLOP/s of ``size`` x ``size`` products (2 size^3 flops each) in ``dtype``, timed for
    at least ``seconds`` after one warm-up product."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    count, start = 0, time.perf_counter()
    while True:
        a @ b
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2 * size**3 * count / elapsed / 1e9


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=2048, help="matrix side (default 2048)")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES),
                        help="precisions to time (default: all)")
    parser.add_argument("--seconds", type=float, default=2.0, help="least time per precision (default 2)")
    args = parser.parse_args(argv)
    auto = precision.resolve("auto")
    result = {
        "cpu_capability": precision.cpu_capability(),
        "cpu_native_bf16": precision.cpu_has_native_bf16(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "auto": auto.name,
        "size": args.size,
        # Three significant figures, not one decimal: a small product on a busy machine can
        # run under 0.05 GFLOP/s, which a fixed decimal would print (and divide by) as 0.
        "gflops": {name: float(f"{gflops(args.size, DTYPES[name], args.seconds):.3g}") for name in args.dtypes},
    }
    if "fp32" in result["gflops"]:
        result["ratio_to_fp32"] = {name: round(value / result["gflops"]["fp32"], 2)
                                   for name, value in result["gflops"].items()}
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
