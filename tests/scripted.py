"""A generation engine that answers from a script: exact control over every response."""

from dataclasses import dataclass

import torch

from spa.models.engine import Generation


@dataclass
class ScriptedEngine:
    """Answers the prompts of call ``i`` with ``script[i]`` (one response per prompt)."""

    tokenizer: object
    script: list[list[str]]
    calls: int = 0
    model: object = None  # weights a rollout log fingerprints (spa.agent.turnlog); any module

    def decode_dtype(self):
        return torch.float32

    def generate(self, prompts, params, progress=False):
        responses = self.script[self.calls]
        self.calls += 1
        assert len(responses) == len(prompts)
        out = []
        for text in responses:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(ids, text, [-0.5] * len(ids), "stop"))
        return out


def wm(actions: str, obs: str = "", pred: str = "") -> str:
    """A well-formed world-model response."""
    return (f"<think><observation>{obs}</observation>go<prediction>{pred}</prediction></think>"
            f"<answer>{actions}</answer>")
