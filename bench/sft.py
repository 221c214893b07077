"""SFT throughput: spa's training step against a plain padded-batch baseline, in one run.

Baseline: batches of ``--batch-size`` examples in random order, right-padded to the
longest, loss from ``model(input_ids, labels=...)`` (logits over the whole sequence),
autocast in the compute precision (``--dtype``, default ``auto``: bf16 where the CPU
computes it natively, else fp32, which is then plain fp32). spa: length-bucketed batches,
the system prompt the batch shares run once (``spa.models.shared_prefix``) and logits
only at the trained positions (``spa.worldmodel.sft``). Both run forward + backward +
AdamW step on the same examples from the same starting weights; tokens/s counts real
(non-padding) tokens.

    python bench/sft.py --data data/sokoban.jsonl   # self-play data from spa selfplay
    python bench/sft.py                             # random-exploration data made on the spot

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import time
from functools import partial

import numpy as np
import torch

from spa import precision
from spa.models import load_model
from spa.models.shared_prefix import shared_prefix_length
from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect
from spa.worldmodel.sft import collate, length_buckets, load_examples, masked_lm_loss
from spa.worldmodel.tokenize import tokenize_example


def run(model, batches, step_fn) -> float:
    """Train on ``batches``; returns real tokens per second."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model.train()
    step_fn(model, batches[0])  # warm-up (allocator, kernels)
    optimizer.zero_grad(set_to_none=True)
    tokens, start = 0, time.perf_counter()
    for batch in batches[1:]:
        step_fn(model, batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += int(batch[1].sum())
    return tokens / (time.perf_counter() - start)


def baseline_step(model, batch, compute):
    ids, attention, mask = batch
    labels = ids.masked_fill(~mask, -100)
    with compute.autocast("cpu"):
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
    loss.backward()


def spa_step(model, batch, compute):
    ids, attention, mask = batch
    with compute.autocast("cpu"):
        loss, count = masked_lm_loss(model, ids, attention, mask)
    (loss / max(count, 1)).backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--data", default=None, help="SFT JSONL (default: random-exploration Sokoban data)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=6, help="timed batches per method (+1 warm-up)")
    parser.add_argument("--dtype", default="auto", help="compute precision: auto (default), bf16, fp16 or fp32")
    args = parser.parse_args()
    compute = precision.decide(args.dtype, "cpu")

    model, tokenizer = load_model(args.model, dtype="fp32")
    if args.data:
        examples = load_examples(args.data)
    else:
        config = SelfPlayConfig(env="sokoban", episodes=64, samples=8, exploration="random")
        examples, _ = build_examples(collect(None, tokenizer, config), config)
    tokenized = [tokenize_example(tokenizer, e["messages"], e["response"]) for e in examples]
    n = args.batch_size * (args.batches + 1)
    rng = np.random.default_rng(0)
    pool = [tokenized[i] for i in rng.choice(len(tokenized), size=min(n, len(tokenized)), replace=False)]
    pad = tokenizer.pad_token_id
    padded = [collate(pool[i:i + args.batch_size], pad) for i in range(0, len(pool), args.batch_size)]
    lengths = [len(e) for e in pool]
    bucketed = [collate([pool[i] for i in b], pad)
                for b in length_buckets(lengths, args.batch_size, np.random.default_rng(0))]

    baseline = run(copy.deepcopy(model), padded, partial(baseline_step, compute=compute))
    ours = run(copy.deepcopy(model), bucketed, partial(spa_step, compute=compute))
    real = sum(lengths)
    print(json.dumps({
        "benchmark": "sft_train_step",
        "model": args.model,
        "data": args.data or "random-exploration sokoban",
        "dtype": compute.name,
        "dtype_reason": compute.reason,
        "cpu_capability": precision.cpu_capability(),
        "cpu_native_bf16": precision.cpu_has_native_bf16(),
        "batch_size": args.batch_size,
        "examples": len(pool),
        "mean_length": round(real / len(pool), 1),
        "padding_fraction_baseline": round(1 - real / sum(b[0].numel() for b in padded), 3),
        "padding_fraction_spa": round(1 - real / sum(b[0].numel() for b in bucketed), 3),
        "mean_shared_prefix_spa": round(float(np.mean([shared_prefix_length(*b) for b in bucketed])), 1),
        "baseline_tokens_per_s": round(baseline, 1),
        "spa_tokens_per_s": round(ours, 1),
        "speedup": round(ours / baseline, 2),
        "threads": torch.get_num_threads(),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }, indent=2))


if __name__ == "__main__":
    main()
