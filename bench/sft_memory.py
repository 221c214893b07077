"""Resident memory of a world-model SFT with and without returning the heap's free pages.

A long-answer SFT inside ``spa run`` grew about 4 GB over one epoch of 270 steps (Sokoban,
world-model prompt, SmolLM2-135M) though every step does the same work. The process
runs with :func:`spa.heap.tune_malloc` (blocks under 64 MiB stay in the heap, for decoding
speed) and the length-bucketed batches come in shuffled widths, so freed activations of
every size are left in the heap. This measures that guess: each setting of
``spa.worldmodel.sft.TRIM_EVERY_STEPS`` (0: never trim; K: ``malloc_trim(0)`` every K
optimizer steps) trains the same steps on the same data from the same weights, each in a
fresh process, whose resident memory the parent samples ten times a second.

    python bench/sft_memory.py                       # 40 steps, trim every 0, 1 and 10 steps
    python bench/sft_memory.py --steps 80 --trim-every 0,10
    python bench/sft_memory.py --steps 24 --trim-every 0,10,1,1,10,0   # drift cancels

Prints one JSON object: per setting the peak resident memory of training (GiB) in the
first and second half of its time (their difference is the growth; the first half holds
AdamW's first allocation), training tokens/s, also as a ratio to the first setting's,
measured in the same run, and the minor page faults of training (a page the heap gave
back and takes again is faulted in anew, zeroed). Successive processes on a shared
machine can drift (the same setting once ran 22% slower three processes later), so a
setting may be given more than once: ``by_setting`` holds each one's mean tokens/s and
its ratio to the first setting's mean, which a palindromic order (``0,10,1,1,10,0``)
keeps free of a linear drift. Checkpoints are not written: only the steps are measured.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def resident_gib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    except (OSError, StopIteration):
        return None
    return kib / 2**20


def child(args) -> None:
    """Train ``--steps`` steps with ``TRIM_EVERY_STEPS = --child``; print tokens/s as JSON."""
    import torch

    from spa import heap
    from spa.models import load_model
    from spa.worldmodel import sft
    from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect

    heap.tune_malloc()  # as in `spa run`, whose play and evaluation tune it before the rounds' SFT
    torch.manual_seed(0)
    model, tokenizer = load_model(args.model, dtype="fp32")
    config = SelfPlayConfig(env="sokoban", episodes=args.episodes, samples=1, exploration="random",
                            mode="world_model", seed=0)
    examples, _ = build_examples(collect(None, tokenizer, config), config)
    rng = np.random.default_rng(0)
    examples = [examples[i] for i in rng.permutation(len(examples))[: args.steps * args.batch_size]]
    if len(examples) < args.steps * args.batch_size:
        raise SystemExit(f"--episodes {args.episodes} gave {len(examples)} examples, fewer than "
                         f"--steps x --batch-size = {args.steps * args.batch_size}; raise --episodes")
    sft.TRIM_EVERY_STEPS = args.child
    # Only the steps: no resume points and no checkpoint at the end (a save's copies would
    # be the peak, and no step's doing).
    sft.RESUME_EVERY_SECONDS = float("inf")
    sft.save_checkpoint = lambda *_, **__: None
    print("ready", flush=True)  # the parent's growth baseline starts after loading
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with tempfile.TemporaryDirectory() as out:
        history = sft.train(model, tokenizer, examples, sft.SFTConfig(
            epochs=1, batch_size=args.batch_size, val_fraction=0.0, precision=args.dtype), out, progress=False)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    print(json.dumps({"tokens_per_second": history[0]["tokens_per_second"], "seconds": history[0]["seconds"],
                      "minor_page_faults": faults}))


def measure(args, trim_every: int) -> dict:
    command = [sys.executable, __file__, "--child", str(trim_every), "--steps", str(args.steps),
               "--batch-size", str(args.batch_size), "--episodes", str(args.episodes), "--model", args.model,
               "--dtype", args.dtype]
    samples: list[tuple[float, float]] = []
    ready = None  # when training starts: loading and data collection are done
    with tempfile.TemporaryFile("w+") as stdout:
        process = subprocess.Popen(command, stdout=stdout, text=True)
        while process.poll() is None:
            if ready is None:
                stdout.seek(0)
                if "ready" in stdout.read():
                    ready = time.perf_counter()
            rss = resident_gib(process.pid)
            if ready is not None and rss is not None:
                samples.append((time.perf_counter() - ready, rss))
            time.sleep(0.1)
        stdout.seek(0)
        lines = stdout.read().splitlines()
    if process.returncode:
        raise SystemExit(f"TRIM_EVERY_STEPS={trim_every}: the training process failed ({process.returncode})")
    result = json.loads(lines[-1])
    memory = dict.fromkeys(["peak_rss_gib", "peak_rss_first_half_gib", "peak_rss_second_half_gib", "growth_gib"])
    if len(samples) >= 2:  # none where training ends within a sampling interval (a tiny model)
        half = samples[-1][0] / 2
        first, second = (max([rss for t, rss in samples if (t < half) == early] or [0.0]) for early in (True, False))
        memory = dict(zip(memory, (round(x, 2) for x in (max(first, second), first, second, second - first))))
    return {"trim_every_steps": trim_every, **memory,
            "tokens_per_second": round(result["tokens_per_second"], 1),
            "train_seconds": round(result["seconds"], 1),
            "minor_page_faults": result["minor_page_faults"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per setting")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=256, help="random-exploration episodes to draw examples from")
    parser.add_argument("--trim-every", default="0,1,10", help="settings of TRIM_EVERY_STEPS, comma-separated")
    parser.add_argument("--dtype", default="auto", help="compute precision: auto (default), bf16, fp16 or fp32")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args)
    try:
        settings = [int(k) for k in args.trim_every.split(",")]
    except ValueError:
        raise SystemExit(f"--trim-every {args.trim_every!r}: want whole numbers >= 0, comma-separated") from None
    if any(k < 0 for k in settings):
        raise SystemExit(f"--trim-every {args.trim_every!r}: want whole numbers >= 0 (0 never trims)")

    from spa import precision

    results = [measure(args, k) for k in settings]
    first = results[0]["tokens_per_second"]
    for r in results:
        r["tokens_per_second_ratio"] = round(r["tokens_per_second"] / first, 3)
    # each setting's processes, settings in the order first given
    runs_of = {k: [r for r in results if r["trim_every_steps"] == k] for k in dict.fromkeys(settings)}
    speeds = {k: float(np.mean([r["tokens_per_second"] for r in runs])) for k, runs in runs_of.items()}
    by_setting = [{"trim_every_steps": k, "runs": len(runs), "tokens_per_second_mean": round(speeds[k], 1),
                   "tokens_per_second_ratio": round(speeds[k] / speeds[settings[0]], 3),
                   "minor_page_faults_mean": round(float(np.mean([r["minor_page_faults"] for r in runs])))}
                  for k, runs in runs_of.items()]
    print(json.dumps({
        "benchmark": "sft_memory",
        "model": args.model,
        "data": "random-exploration sokoban, world-model prompt",
        "steps": args.steps,
        "batch_size": args.batch_size,
        "dtype": precision.decide(args.dtype, "cpu").name,
        "cpu_capability": precision.cpu_capability(),
        "cpu_native_bf16": precision.cpu_has_native_bf16(),
        "settings": results,
        "by_setting": by_setting,
    }, indent=2))


if __name__ == "__main__":
    main()
