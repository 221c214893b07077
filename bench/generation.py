"""Throughput of spa's generation engine against ``model.generate``, printed as JSON.

The workload is shaped like the agent's rollouts: every prompt is a chat with the same
system prompt (game rules; 294 shared tokens with the chat template) and a short
per-sequence user message (a Sokoban grid of varying size, coordinates and a turn
counter; 62-81 tokens), so prompt lengths differ (356-375 tokens). Both sides
sample at temperature 1 (top-p 1, no top-k) and generate exactly ``--new-tokens``
tokens per sequence: eos and stop strings are disabled (``min_new_tokens`` for
``model.generate``, an empty ``eos_token_ids`` and ``stop=()`` for the engine). Only
generated tokens are counted; the time includes prefill. Each side first runs a tiny
warm-up call, not timed; with ``--repeats`` the two alternate and medians are reported.

    python bench/generation.py                      # SmolLM2-135M, batch 64, 128 tokens
    python bench/generation.py --dtype fp32         # force a precision (default: auto)
    python bench/generation.py --skip-hf            # the engine only
    python bench/generation.py --model tiny --dtype fp32 --new-tokens 16   # smoke run
    python bench/generation.py --skip-hf --profile  # and where the engine's time goes
    python bench/generation.py --model DIR --random-init --device cuda     # a GPU, random weights
    python bench/generation.py --model DIR --random-init --device cuda --batch 64 128 256  # a sweep

The precision is ``auto`` unless ``--dtype`` says otherwise: bf16 where the hardware
computes it natively, fp32 elsewhere (``spa.precision``); the JSON names the precision
used, why, and torch's CPU capability. ``--random-init`` builds the model from DIR's
``config.json`` with random weights (DIR needs only the config and tokenizer files),
for machines the real weights cannot reach; throughput does not depend on the weights
(both sides generate exactly ``--new-tokens`` tokens).

``--batch`` takes one size or several: each is the number of prompts and the engine's batch
(``engine_batch``), and a sweep prints the shared fields once and one entry per size under
``runs``. The warm-up call builds the engine's fused weights, which it keeps (as it does
between a rollout's turns), so the timed runs do not rebuild them. ``--no-overlap`` turns off
the engine's overlap of decode steps with the host's bookkeeping (on by default for a CUDA
model, off on a CPU; ``spa.models.engine.Engine``), to compare the two on a GPU.

``--profile`` runs the engine once more under ``torch.profiler`` and adds a breakdown:
seconds in prefill, decode steps, sampling and the rest (host bookkeeping: stop
strings, compaction), and seconds per kind of operator (linear layers, attention
matmuls, softmax, everything else). Profiling adds a few microseconds per operator, so
read the shares, not the absolute figures.

The machine may be shared: compare the two figures of one run, not figures of runs at
different times. Constructing the engine tunes glibc's malloc for the whole process
(see ``spa.heap.tune_malloc``), so ``model.generate`` runs under the same
allocator settings as the engine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time

import torch

from spa import precision
from spa.models import llama_decoder, load_model
from spa.models.engine import Engine, SamplingParams

SYSTEM_PROMPT = """You are an agent playing Sokoban. Push every box onto a target.

Grid symbols: `#` wall, `_` empty floor, `O` target, `X` box, `√` box on a target, `P` you, `S` you on a target.

Rules:
1. Each action moves you one cell Up, Down, Left or Right; walls block you.
2. Walking into a box pushes it one cell further, only if the cell behind it is floor or a target. You cannot pull boxes or push two at once.
3. A box pushed into a corner that is not a target is stuck for ever.
4. Rewards: -0.1 per step, +1 when a box reaches a target, -1 when it leaves one, +10 when all boxes are on targets.
5. Give up to 3 actions per turn, separated by `||`, e.g. `Up || Left`.

Coordinates are 0-indexed (row, column) from the top-left corner.

Format: think inside <think></think>; there, restate the current state inside <observation></observation>, reason about your moves, and give the state you expect after them inside <prediction></prediction>. Then give your actions inside <answer></answer>."""


def load_bench_model(name: str, dtype: torch.dtype, device: str, random_init: bool):
    """The model and tokenizer: loaded, or (``random_init``) built from the folder's config."""
    if not random_init:
        return load_model(name, dtype=dtype, device=device)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from spa.models.loading import prepare_tokenizer

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(name)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(name))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def make_state(rng: random.Random, turn: int) -> str:
    """A random Sokoban-like grid (size varies) with a coordinate description."""
    size = rng.choice([5, 6, 7, 8])
    inner = [["#"] + ["_"] * (size - 2) + ["#"] for _ in range(size - 2)]
    cells = [["#"] * size] + inner + [["#"] * size]
    free = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    (pr, pc), (br, bc), (tr, tc) = rng.sample(free, 3)
    cells[pr][pc], cells[br][bc], cells[tr][tc] = "P", "X", "O"
    grid = "\n".join("".join(row) for row in cells)
    return (
        f"Turn {turn} of 5. Current state:\n{grid}\n"
        f"Player at ({pr},{pc}); Box at ({br},{bc}); Target at ({tr},{tc}).\n"
        "Decide your next actions."
    )


def make_prompts(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": make_state(rng, 1 + i % 5)},
        ]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # BatchEncoding in recent transformers
            ids = ids["input_ids"]
        prompts.append(list(ids))
    return prompts


def shared_prefix(prompts: list[list[int]]) -> int:
    n = 0
    while all(len(p) > n and p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def run_hf(model, tokenizer, prompts, new_tokens: int, seed: int) -> float:
    """Seconds for ``model.generate`` to sample exactly ``new_tokens`` per prompt."""
    enc = tokenizer.pad({"input_ids": prompts}, return_tensors="pt").to(model.device)
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
    if out.is_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    assert out.shape[1] - enc["input_ids"].shape[1] == new_tokens
    return seconds


def run_engine(engine: Engine, prompts, new_tokens: int, seed: int) -> float:
    """Seconds for the engine to sample exactly ``new_tokens`` per prompt."""
    params = SamplingParams(
        max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, stop=(), seed=seed
    )
    start = time.perf_counter()
    gens = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    assert all(len(g.token_ids) == new_tokens for g in gens)
    return seconds


# operator name -> kind, for the profile breakdown (self time of the leaf operators)
OP_KINDS = {
    "mkldnn::_linear_pointwise": "linear",
    "aten::addmm": "linear",
    "aten::mm": "linear",
    "aten::bmm": "attention_matmul",
    "aten::_softmax": "softmax",
    "aten::_log_softmax": "softmax",
}
PHASES = ("spa.prefill", "spa.step", "spa.sample")


def profile_engine(engine: Engine, prompts, new_tokens: int, seed: int) -> dict:
    """One engine run under ``torch.profiler``: seconds per phase and per operator kind."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        seconds = run_engine(engine, prompts, new_tokens, seed)
    phases = dict.fromkeys(PHASES, 0.0)
    for event in prof.events():
        if event.name in phases:
            phases[event.name] += event.cpu_time_total / 1e6
    kinds: dict[str, float] = {}
    for op in prof.key_averages():
        if op.key in PHASES:
            continue
        kind = OP_KINDS.get(op.key, "other_ops")
        kinds[kind] = kinds.get(kind, 0.0) + op.self_cpu_time_total / 1e6
    phases["host_other"] = seconds - sum(phases.values())
    return {
        "seconds": round(seconds, 3),
        # the profiler counts whole microseconds; rounding coarser than that turns a tiny
        # model's sub-millisecond operators into zeros
        "phases_s": {k.removeprefix("spa."): round(v, 6) for k, v in phases.items()},
        "ops_s": {k: round(v, 6) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
    }


def summary(seconds: list[float], generated: int) -> dict:
    """Median time and throughput over the repeats, plus every run's time."""
    median = statistics.median(seconds)
    return {
        "seconds": round(median, 2),
        "tokens_per_s": round(generated / median, 1),
        "runs_s": [round(s, 2) for s in seconds],
    }


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a batch size (>= 1)")
    return value


def run_batch(args, model, tokenizer, batch: int) -> dict:
    """One batch size: ``batch`` prompts through the engine (batch ``batch``) and, unless
    ``--skip-hf``, through ``model.generate``."""
    prompts = make_prompts(tokenizer, batch, args.seed)
    lengths = [len(p) for p in prompts]
    engine = Engine(model, tokenizer, max_batch_size=batch)
    engine.eos_token_ids = set()  # generate exactly --new-tokens, like min_new_tokens
    engine.overlap = engine.overlap and not args.no_overlap
    generated = batch * args.new_tokens

    run_engine(engine, prompts[:2], 4, args.seed)  # warm-up
    if not args.skip_hf:
        run_hf(model, tokenizer, prompts[:2], 4, args.seed)  # warm-up
    engine_s, hf_s = [], []
    for _ in range(args.repeats):  # alternated, so that both see the same machine state
        engine_s.append(run_engine(engine, prompts, args.new_tokens, args.seed))
        if not args.skip_hf:
            hf_s.append(run_hf(model, tokenizer, prompts, args.new_tokens, args.seed))
    result = {
        "batch": batch,
        "prompt_tokens": {
            "min": min(lengths),
            "max": max(lengths),
            "mean": round(sum(lengths) / len(lengths), 1),
            "shared_prefix": shared_prefix(prompts),
        },
        "engine": summary(engine_s, generated)
        | {"path": "llama fast path" if engine.fast else f"generic ({engine.fast_problem})",
           "overlap": engine.overlap},
    }
    if not args.skip_hf:
        result["hf_generate"] = summary(hf_s, generated) | {
            "attn_implementation": model.config._attn_implementation
        }
        result["speedup"] = round(statistics.median(hf_s) / statistics.median(engine_s), 2)
    if args.profile:
        result["engine_profile"] = profile_engine(engine, prompts, args.new_tokens, args.seed)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto", help="auto (default), bf16, fp16 or fp32")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--random-init", action="store_true",
                        help="random weights of MODEL's architecture (MODEL: a folder with config.json)")
    parser.add_argument("--batch", type=positive, nargs="+", default=[64],
                        help="prompts, and the engine's batch; several sizes: a sweep (default 64)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of each (medians)")
    parser.add_argument("--skip-hf", action="store_true", help="time the engine only")
    parser.add_argument("--no-pack", action="store_true",
                        help="the engine's linear layers unpacked (F.linear), the path before fp32 prepacking")
    parser.add_argument("--no-overlap", action="store_true",
                        help="no overlap of decode steps with the host's bookkeeping (the CUDA default)")
    parser.add_argument(
        "--profile", action="store_true", help="add where the engine's time goes (one more run)"
    )
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.no_pack:
        llama_decoder.PACK = False
    chosen = precision.decide(args.dtype, args.device)
    model, tokenizer = load_bench_model(args.model, chosen.dtype, args.device, args.random_init)
    result = {
        "model": args.model,
        "dtype": chosen.name,
        "dtype_reason": chosen.reason,
        "cpu_capability": precision.cpu_capability(),
        "cpu_native_bf16": precision.cpu_has_native_bf16(),
        "device": str(model.device),
        "gpu": torch.cuda.get_device_name() if model.device.type == "cuda" else None,
        "random_init": args.random_init,
        "packed_linear": not args.no_pack,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "new_tokens": args.new_tokens,
        "sampling": "temperature 1, top_p 1, eos and stop strings disabled",
        "repeats": args.repeats,
    }
    runs = [run_batch(args, model, tokenizer, batch) for batch in args.batch]
    result |= runs[0] if len(runs) == 1 else {"runs": runs}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
