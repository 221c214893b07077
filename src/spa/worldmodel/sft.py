"""World-model SFT: masked cross-entropy on the corrected self-play turns.

The loop, top to bottom: load and tokenize the data, split off a held-out set, then per
epoch: length-bucketed batches (similar lengths together, so little compute goes to
padding), masked loss with logits computed only at the trained positions (the
vocabulary projection is a fifth of the model's compute and most of its activation
memory), AdamW with linear warm-up and cosine decay, gradient accumulation; after the
epoch, validation loss and next-state prediction exact match on the held-out set, and
an atomic Hugging Face checkpoint. Every ``RESUME_EVERY_SECONDS`` inside an epoch the
weights, optimizer state and position in the epoch go to ``resume/`` as well (an epoch of
expert-iteration SFT takes 25-45 minutes on 2 CPU cores), so an interrupted run
continues from there, or after the last complete epoch, with the optimizer, scheduler
and data order it had. Ctrl-C or SIGTERM writes that resume point at the end of the
current step before stopping, and SIGUSR1 writes one without stopping
(:mod:`spa.interrupt`).

Under ``accelerate launch`` (see :mod:`spa.distributed`) the model trains wrapped in DDP
(or FSDP: ``parallel``);
every process builds the same batch list (it depends only on (seed, epoch)) and takes its
share of each optimizer step's micro-batches; the loss is divided by the step's global
target count, so the summed gradients are the single-process gradient and N processes
train exactly what one would (a step of ``grad_accum`` micro-batches keeps
``min(grad_accum, N)`` processes busy, the others run zero-weight padding passes: make
``grad_accum`` a multiple of N). Validation is sharded too; the main process writes the
checkpoints and metrics.

Paper defaults: lr 1e-4, 5 epochs (more epochs help: 1 epoch gives 29.2/52.7 vs 5
epochs 59.8/69.5 Sokoban Pass@1/Pass@8).
"""

from __future__ import annotations

import json
import math
import shutil
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from spa import distributed, heap, interrupt
from spa import precision as precision_
from spa.agent.grids import exact_match
from spa.compute import Compute, for_model
from spa.io import TRAINER_STATE, atomic_dir, write_json
from spa.models.device import model_device, on_device
from spa.models.lora import add_lora, is_lora, load_adapter, merged_copy
from spa.models.recompute import enable_recompute
from spa.models.shared_prefix import hidden_states
from spa.models.tokens import TokenizedExample
from spa.progress import Bar, quiet_hf_bars
from spa.worldmodel.tokenize import tokenize_example

#: The mid-epoch resume point in an SFT output folder, and the file there that says where
#: in which epoch it is (readable without loading the state).
MID_EPOCH, POSITION = "resume", "position.json"
#: Seconds of training between mid-epoch resume points: writing one (weights and AdamW
#: state, 1.6 GB for the 135M model) takes a few seconds.
RESUME_EVERY_SECONDS = 600.0
#: Optimizer steps between two returns of the heap's free pages (:func:`spa.heap.trim`);
#: 0 never. Off, because it costs more than it saves where memory suffices: trimming every
#: step took a long-answer SFT's peak from 8.79 to 6.65 GB but ran at about 0.85x the
#: tokens/s (``bench/sft_memory.py``; docs/comparison.md, "Memory").
TRIM_EVERY_STEPS = 0


@dataclass
class SFTConfig:
    """Hyper-parameters of world-model SFT (paper defaults where the paper gives them)."""

    lr: float = field(default=1e-4, metadata={"help": "Peak learning rate (paper: 1e-4)."})
    epochs: int = field(default=5, metadata={"help": "Epochs (paper: 5)."})
    batch_size: int = field(default=8, metadata={"help": "Sequences per micro-batch."})
    grad_accum: int = field(default=1, metadata={"help": "Micro-batches per optimizer step."})
    warmup_ratio: float = 0.1  # linear warm-up over this fraction of steps, then cosine
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_length: int = field(default=2048, metadata={"help": "Drop longer examples (counted in the stats)."})
    mask_states: bool = field(default=False, metadata={"help": (
        "Exclude observation/prediction contents from the loss (the release's behaviour; the "
        "no-transition-learning ablation).")})
    val_fraction: float = field(default=0.1, metadata={"help": "Held-out share of the episodes."})
    val_examples_generate: int = 64  # held-out examples used for next-state exact match
    val_max_new_tokens: int = 160  # token cap when the model writes a held-out next state
    lora_rank: int = field(default=0, metadata={"help": (
        "LoRA rank (peft adapters instead of full fine-tuning); 0: off.")})
    gradient_checkpointing: bool = field(default=False, metadata={"help": (
        "Recompute each layer's activations in the backward pass instead of keeping them: "
        "much less activation memory for about a third more compute (spa.models.recompute).")})
    parallel: str = field(default="ddp", metadata={"help": distributed.PARALLEL_HELP})
    precision: str = field(default="auto", metadata={"help": precision_.FIELD_HELP})
    seed: int = field(default=0, metadata={"help": "Data order and split seed."})

    RENAMED_KEYS: ClassVar[dict] = dict([precision_.RENAMED_BF16])

    def __post_init__(self) -> None:
        self.precision = precision_.check(self.precision)
        distributed.check_strategy(self.parallel)
        if self.parallel == "fsdp" and self.lora_rank > 0:
            raise ValueError("parallel=fsdp does not go with lora_rank > 0: a checkpoint folds the adapters into "
                             "a copy of the model, and FSDP's sharded modules cannot be copied; use parallel=ddp")
        checks = {"lr": self.lr > 0, "epochs": self.epochs >= 1, "batch_size": self.batch_size >= 1,
                  "grad_accum": self.grad_accum >= 1, "warmup_ratio": 0 <= self.warmup_ratio < 1,
                  "val_fraction": 0 <= self.val_fraction < 1, "lora_rank": self.lora_rank >= 0}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is out of range")


def load_examples(path: str | Path) -> list[dict]:
    """Read SFT examples (one JSON object per line, as ``spa selfplay`` writes them)."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def split(examples: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Train / held-out split by episode, so turns of one episode never straddle it."""
    episodes = sorted({(e.get("seed"), e.get("sample")) for e in examples}, key=str)
    rng = np.random.default_rng(seed)
    held = {episodes[i] for i in rng.permutation(len(episodes))[: round(fraction * len(episodes))]}
    train = [e for e in examples if (e.get("seed"), e.get("sample")) not in held]
    return train, [e for e in examples if (e.get("seed"), e.get("sample")) in held]


def length_buckets(lengths: list[int], batch_size: int, rng: np.random.Generator) -> list[list[int]]:
    """Batches of indices with similar lengths, in random order.

    Indices are shuffled, cut into chunks of 50 batches, sorted by length inside each
    chunk and batched: padding stays small while every epoch still sees a new order.
    """
    order = rng.permutation(len(lengths))
    chunk = batch_size * 50
    batches = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start:start + chunk], key=lambda i: lengths[i])
        batches += [list(part[i:i + batch_size]) for i in range(0, len(part), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def collate(batch: list[TokenizedExample], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded ids, attention mask and loss mask, each (B, T)."""
    width = max(len(e) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    loss_mask = torch.zeros((len(batch), width), dtype=torch.bool)
    for row, example in enumerate(batch):
        ids[row, : len(example)] = torch.tensor(example.input_ids)
        attention[row, : len(example)] = 1
        loss_mask[row, : len(example)] = torch.tensor(example.loss_mask)
    return ids, attention, loss_mask


def masked_lm_loss(model, ids: torch.Tensor, attention: torch.Tensor, loss_mask: torch.Tensor
                   ) -> tuple[torch.Tensor, int]:
    """Sum of token cross-entropies over the masked targets, and their count.

    Token ``t`` is predicted from the hidden state at ``t - 1``; the vocabulary
    projection runs only on those positions, and the system prompt all rows share runs
    once (:func:`spa.models.shared_prefix.hidden_states`).
    """
    hidden, offset = hidden_states(model.get_decoder(), ids, attention, loss_mask)
    targets = loss_mask[:, offset + 1:]
    logits = model.get_output_embeddings()(hidden[:, :-1][targets]).float()
    loss = torch.nn.functional.cross_entropy(logits, ids[:, offset + 1:][targets], reduction="sum")
    return loss, int(targets.sum())


def lr_lambda(total_steps: int, warmup_ratio: float):
    """Linear warm-up, then cosine decay to zero, as a multiplier of the base lr."""
    warmup = max(1, round(warmup_ratio * total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def validate(model, tokenizer, examples: list[TokenizedExample], raw: list[dict], config: SFTConfig,
             compute: Compute) -> dict:
    """Held-out masked loss and next-state prediction exact match (greedy), in ``compute``'s precision.

    Each process scores its share of the examples and probes; the sums are added, so the
    numbers are those of the whole held-out set.
    """
    # Only world-model responses have a next state to write; plain-mode examples are scored by loss alone.
    probe = [e for e in raw if "<prediction>" in e["response"]][: config.val_examples_generate]
    loss, count, hits, probes = distributed.total(*_validation_sums(
        model, tokenizer, distributed.shard(examples), distributed.shard(probe), config, compute))
    return {"val_loss": loss / max(count, 1), "val_prediction_exact": hits / probes if probes else 0.0,
            "val_examples": len(examples)}


@torch.no_grad()
def _validation_sums(model, tokenizer, examples: list[TokenizedExample], probe: list[dict], config: SFTConfig,
                     compute: Compute) -> tuple[float, int, int, int]:
    """Summed held-out loss, its target count, exact next states and probes written."""
    from spa.models.engine import Engine, SamplingParams

    model.eval()
    generator = merged_copy(model)  # adapters folded in, so generation takes the fast path
    total, count = 0.0, 0
    for start in range(0, len(examples), config.batch_size):
        batch = collate(examples[start:start + config.batch_size], tokenizer.pad_token_id)
        with compute.autocast(model_device(model)):
            loss, n = masked_lm_loss(model, *on_device(batch, model))
        total, count = total + loss.item(), count + n
    # Next-state prediction: the held-out prompt and response up to <prediction> as the
    # prefix, the model writes the state, compared with the true state after the turn.
    prompts = []
    for example in probe:
        prompt = tokenizer.apply_chat_template(example["messages"], tokenize=False, add_generation_prompt=True)
        prefix = example["response"][: example["response"].find("<prediction>") + len("<prediction>")]
        prompts.append(tokenizer(prompt + prefix, add_special_tokens=False)["input_ids"])
    params = SamplingParams(max_new_tokens=config.val_max_new_tokens, temperature=0.0, stop=("</prediction>",))
    outputs = Engine(generator, tokenizer, dtype=compute.decode_dtype).generate(prompts, params) if prompts else []
    hits = [exact_match(out.text.split("</prediction>")[0], ex["state_after"]) for out, ex in zip(outputs, probe)]
    return total, count, sum(hits), len(hits)


def save_checkpoint(out: Path, epoch: int, model, tokenizer, optimizer, scheduler, history: list[dict],
                    position: dict | None = None) -> Path:
    """Write ``out/epoch-N`` atomically: weights (HF format), tokenizer, optimizer state;
    with LoRA the weights are merged and the adapters go to ``adapter/`` as well.

    The older epochs keep their weights but lose their optimizer state: only the newest
    epoch is a resume point (:func:`last_checkpoint`), and each state is twice the
    weights (21.5 GB at the end of a 20-epoch run of the 135M model).

    With ``position`` (how far into epoch N + 1 training got) the same goes to the
    mid-epoch resume point ``out/resume`` instead, with the position beside it.
    """
    final = out / (MID_EPOCH if position is not None else f"epoch-{epoch}")
    with atomic_dir(final) as tmp, quiet_hf_bars():
        # a plain model, whatever the training used (whole tensors under FSDP)
        merged_copy(model).save_pretrained(tmp, state_dict=distributed.state_dict(model))
        if is_lora(model):
            model.save_pretrained(tmp / "adapter")  # the adapters alone, to resume exactly
        tokenizer.save_pretrained(tmp)
        torch.save({"optimizer": distributed.optimizer_state(optimizer), "scheduler": scheduler.state_dict(),
                    "epoch": epoch, "history": history, "position": position}, tmp / TRAINER_STATE)
        if position is not None:
            write_json(tmp / POSITION, {"epoch": epoch, "batches": position["batches"]})
    if position is None:
        for older in range(1, epoch):
            (out / f"epoch-{older}" / TRAINER_STATE).unlink(missing_ok=True)
        shutil.rmtree(out / MID_EPOCH, ignore_errors=True)  # older than this epoch now
    return final


def resume_model(load, base: str, checkpoint: Path | None):
    """``(model, tokenizer)`` to train: ``load(base)``, or the checkpoint to resume from.

    A LoRA checkpoint resumes from the base weights plus its saved adapters (its merged
    weights would restart the adapters from zero and break the optimizer state).
    """
    if checkpoint is not None and (checkpoint / "adapter").is_dir():
        model, tokenizer = load(base)
        return load_adapter(model, checkpoint / "adapter"), tokenizer
    return load(str(checkpoint) if checkpoint is not None else base)


def last_checkpoint(out: Path) -> Path | None:
    """The newest resume point in ``out``: the mid-epoch one, or the newest complete
    ``epoch-N`` folder; None if there is neither."""
    def epoch_of(folder: Path) -> int:
        return int(folder.name.split("-")[1])

    done = [p for p in out.glob("epoch-*") if (p / TRAINER_STATE).is_file()]
    newest = max(done, key=epoch_of, default=None)
    mid = out / MID_EPOCH
    if (mid / TRAINER_STATE).is_file() and (mid / POSITION).is_file():
        # Written after epoch N (its "epoch"); stale if an interrupt came between a later
        # epoch's checkpoint and its removal.
        epoch = json.loads((mid / POSITION).read_text(encoding="utf-8"))["epoch"]
        if newest is None or epoch >= epoch_of(newest):
            return mid
    return newest


def train(model, tokenizer, examples: list[dict], config: SFTConfig, out: str | Path,
          resume_from: Path | None = None, progress: bool = True, compute: Compute | None = None) -> list[dict]:
    """Run world-model SFT; returns the per-epoch history (also in ``out/metrics.json``).

    ``resume_from`` is a checkpoint folder whose weights ``model`` already holds (see
    :func:`resume_model`); its optimizer and scheduler state are restored and training
    continues with the next epoch, or mid-epoch from a ``resume/`` point.
    ``config.lora_rank > 0`` trains LoRA adapters only. ``compute``: the device and
    precision the caller decided (:func:`spa.compute.decide`, from ``config.precision``);
    None decides ``config.precision`` here, on the model's device.
    Launched on several processes, they train one model together (module docstring).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    model = distributed.place(model)
    compute = compute or for_model(model, config.precision)
    if config.gradient_checkpointing:
        enable_recompute(model)
    if config.lora_rank and not is_lora(model):
        model = add_lora(model, config.lora_rank)
    # The training passes go through ``trained`` (DDP or FSDP under a launcher, ``model``
    # alone); validation, generation and checkpoints use ``model`` (whole in distributed.gathered).
    trained = distributed.wrap(model, config.parallel)
    train_raw, val_raw = split(examples, config.val_fraction, config.seed)
    train_set, val_set = ([tokenize_example(tokenizer, e["messages"], e["response"], config.mask_states,
                                            e.get("masked_states", ())) for e in raw] for raw in (train_raw, val_raw))
    too_long = sum(len(e) > config.max_length for e in train_set)
    train_set = [e for e in train_set if len(e) <= config.max_length]
    if not train_set:
        raise ValueError("no training examples left (all held out or longer than max_length)")
    # Token t is a target when loss_mask[t] and t > 0 (the first token has no context).
    targets_of = [sum(e.loss_mask[1:]) for e in train_set]
    lengths = [len(e) for e in train_set]
    batches_per_epoch = math.ceil(len(train_set) / config.batch_size)
    steps_per_epoch = math.ceil(batches_per_epoch / config.grad_accum)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(steps_per_epoch * config.epochs, config.warmup_ratio))
    history: list[dict] = []
    start_epoch, position = 0, None
    if resume_from is not None:
        state = torch.load(resume_from / TRAINER_STATE, weights_only=False, map_location="cpu")
        distributed.load_optimizer_state(optimizer, state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        history, start_epoch, position = state["history"], state["epoch"], state.get("position")
    processes = distributed.world()[1]
    if config.grad_accum % processes:
        warnings.warn(f"grad_accum={config.grad_accum} is not a multiple of the {processes} processes: "
                      "some of them idle during each step", stacklevel=2)
    with Bar(disable=not progress or not distributed.is_main()) as bar, interrupt.graceful() as requests:
        for epoch in range(start_epoch, config.epochs):
            # The order depends only on (seed, epoch): a resumed run sees what it would
            # have, and every process sees the same list.
            batches = length_buckets(lengths, config.batch_size, np.random.default_rng([config.seed, epoch]))
            task = bar.add_task(f"epoch {epoch + 1}/{config.epochs}", total=len(batches), info="")
            model.train()
            # A mid-epoch resume point carries how far the epoch got and its running sums.
            done, tokens, loss_sum, loss_count, before = (0, 0, 0.0, 0, 0.0) if position is None else (
                position["batches"], position["tokens"], position["loss_sum"], position["loss_count"],
                position["seconds"])
            if position is not None:
                torch.set_rng_state(position["rng"])  # dropout, where a model has it, draws on
                bar.update(task, advance=done)
            position = None
            start = saved = time.perf_counter()
            for first in range(done, len(batches), config.grad_accum):
                step_batches = batches[first:first + config.grad_accum]
                for loss, n, seen in _accumulate(trained, train_set, step_batches, targets_of,
                                                 tokenizer.pad_token_id, config, compute):
                    loss_sum, loss_count, tokens = loss_sum + loss, loss_count + n, tokens + seen
                torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                if TRIM_EVERY_STEPS and (first // config.grad_accum + 1) % TRIM_EVERY_STEPS == 0:
                    heap.trim()
                now = time.perf_counter()
                rate = tokens / (before + now - start)
                bar.update(task, advance=len(step_batches),
                           info=f"loss {loss_sum / max(loss_count, 1):.3f}  {rate:.0f} tok/s")
                done = first + len(step_batches)
                stop, save_now = requests.take()
                # the main process's clock decides for all: each takes part in a save (FSDP gathers)
                due = distributed.broadcast_value(now - saved >= RESUME_EVERY_SECONDS and done < len(batches))
                if stop or save_now or due:
                    with distributed.gathered(model, optimizer):
                        if distributed.is_main():
                            save_checkpoint(out, epoch, model, tokenizer, optimizer, scheduler, history, position={
                                "batches": done, "tokens": tokens, "loss_sum": loss_sum, "loss_count": loss_count,
                                "seconds": before + now - start, "rng": torch.get_rng_state()})
                    saved = time.perf_counter()
                if stop:
                    distributed.wait()
                    raise interrupt.stopped(f"epoch {epoch + 1} of {config.epochs} at batch {done} of "
                                            f"{len(batches)} is saved in {out / MID_EPOCH}")
            seconds = before + time.perf_counter() - start
            loss_sum, loss_count, tokens = distributed.total(loss_sum, loss_count, tokens)
            with distributed.gathered(model, optimizer):  # FSDP: the whole weights, to validate and save
                record = {"epoch": epoch + 1, "train_loss": loss_sum / max(loss_count, 1),
                          "tokens_per_second": tokens / seconds, "seconds": seconds,
                          "lr": scheduler.get_last_lr()[0], "dropped_too_long": too_long,
                          **validate(model, tokenizer, val_set, val_raw, config, compute)}
                history.append(record)
                if distributed.is_main():
                    save_checkpoint(out, epoch + 1, model, tokenizer, optimizer, scheduler, history)
                    write_json(out / "metrics.json", {"config": asdict(config), "epochs": history})
            distributed.wait()  # the checkpoint exists for every process once train returns
    return history


def _accumulate(trained, train_set: list[TokenizedExample], step_batches: list[list[int]], targets_of: list[int],
                pad_id: int, config: SFTConfig, compute: Compute) -> list[tuple[float, int, int]]:
    """Forward and backward this process's share of one optimizer step's micro-batches,
    through ``trained`` (:func:`spa.distributed.wrap`'s result).

    Each loss is divided by the target count of the *whole* step (every micro-batch, on
    every process), so accumulating k micro-batches gives exactly the gradient of one
    batch k times larger, and summing the processes' gradients gives the gradient one
    process would have. Where another process holds more micro-batches, this one pads
    with passes that add nothing (:func:`spa.distributed.accumulation`). Returns each
    of its own micro-batches' summed loss, target count and tokens.
    """
    targets = sum(targets_of[i] for b in step_batches for i in b)
    done = []
    for b, context in distributed.accumulation(trained, distributed.shard(step_batches)):
        with context:
            if b is None:  # another process holds more micro-batches in this step
                _padding_pass(trained, pad_id, compute)
                continue
            ids, attention, mask = on_device(collate([train_set[i] for i in b], pad_id), trained)
            with compute.autocast(model_device(trained)):
                loss, n = distributed.forward(trained, masked_lm_loss, ids, attention, mask)
            (loss / max(targets, 1)).backward()
        done.append((loss.item(), n, int(attention.sum())))
    return done


def _padding_pass(trained, pad_id: int, compute: Compute) -> None:
    """A forward and backward that adds nothing to the gradients (see
    :func:`spa.distributed.accumulation`): two tokens, the second a target, and the loss
    multiplied by 0; every parameter is in its graph, as in a real micro-batch's."""
    example = TokenizedExample([pad_id, pad_id], [False, True])
    ids, attention, mask = on_device(collate([example], pad_id), trained)
    with compute.autocast(model_device(trained)):
        loss, _ = distributed.forward(trained, masked_lm_loss, ids, attention, mask)
    (loss * 0.0).backward()
