"""Interrupt an evaluation after its first turn and an SFT run inside its last epoch, resume
both, and compare them with uninterrupted runs; prints JSON.

Random weights in a small Llama with the default model's tokenizer (or ``--tokenizer DIR``,
a folder holding only tokenizer files, as on a machine without the default model), on the
GPU where there is one. On a CPU both resumes match exactly; on a GPU the evaluation does,
and SFT differs from an uninterrupted run by as much as two uninterrupted runs differ from
each other (docs/distributed.md, "One GPU")::

    python experiments/resume_check.py runs/resume-check [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

import spa.worldmodel.sft as sft
from spa.agent.prompts import PromptConfig
from spa.agent.turnlog import TurnLog
from spa.eval.evaluate import EvalConfig, evaluate
from spa.models.loading import default_model_path, prepare_tokenizer
from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect


class Interrupt(Exception):
    pass


def largest_difference(a, b) -> float:
    return max((p.float() - q.float()).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the default model's)")
    parser.add_argument("--levels", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--episodes", type=int, default=24, help="random-play episodes for SFT data")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(args.tokenizer or default_model_path()))
    shutil.rmtree(args.out, ignore_errors=True)

    def model(seed: int = 0):
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=4096, tie_word_embeddings=True,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).to(device).eval()

    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    lm = model()
    config = EvalConfig("frozenlake", {"is_slippery": True}, PromptConfig("base", max_turns=3),
                        num_envs=args.levels, samples=args.samples, max_new_tokens=48)
    evaluate(lm, tokenizer, config, args.out / "whole", progress=False)
    append = TurnLog.append

    def append_then_stop(self, played):
        append(self, played)
        raise Interrupt

    TurnLog.append = append_then_stop
    try:
        evaluate(lm, tokenizer, config, args.out / "resumed", progress=False)
    except Interrupt:
        pass
    finally:
        TurnLog.append = append
    evaluate(lm, tokenizer, config, args.out / "resumed", progress=False)
    report["eval_trajectories_identical"] = ((args.out / "resumed" / "trajectories.jsonl").read_bytes()
                                             == (args.out / "whole" / "trajectories.jsonl").read_bytes())

    play = SelfPlayConfig(env="frozenlake", episodes=args.episodes, samples=2, max_turns=1, exploration="random")
    examples, _ = build_examples(collect(None, tokenizer, play), play)
    settings = sft.SFTConfig(lr=3e-3, epochs=2, batch_size=2, val_fraction=0.25, val_examples_generate=2,
                             val_max_new_tokens=8, precision="auto")
    whole, twice = model(1).train(), model(1).train()
    sft.train(whole, tokenizer, examples, settings, args.out / "sft-whole", progress=False)
    sft.train(twice, tokenizer, examples, settings, args.out / "sft-twice", progress=False)
    every, save = sft.RESUME_EVERY_SECONDS, sft.save_checkpoint

    def save_then_stop(*positional, position=None, **named):
        save(*positional, position=position, **named)
        if position is not None and positional[1] == 1:  # the first resume point of epoch 2
            raise Interrupt

    sft.RESUME_EVERY_SECONDS, sft.save_checkpoint = 0.0, save_then_stop
    try:
        sft.train(model(1).train(), tokenizer, examples, settings, args.out / "sft-resumed", progress=False)
    except Interrupt:
        pass
    finally:
        sft.save_checkpoint = save
    point = sft.last_checkpoint(args.out / "sft-resumed")
    report["resume_point"] = json.loads((point / sft.POSITION).read_text())
    resumed = AutoModelForCausalLM.from_pretrained(str(point)).to(device)
    try:  # the resumed run writes its resume points as often as the interrupted one did
        sft.train(resumed, tokenizer, examples, settings, args.out / "sft-resumed", resume_from=point, progress=False)
    finally:
        sft.RESUME_EVERY_SECONDS = every
    report["sft_resumed_vs_whole"] = largest_difference(resumed, whole)
    report["sft_whole_vs_whole_again"] = largest_difference(twice, whole)
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
