"""Parse a model response of the form ``<think>...</think><answer>...</answer>``.

In world-model mode the think block also holds ``<observation>S_t</observation>`` and
``<prediction>S_t+1</prediction>``. Parsing is lenient about what surrounds the tags
and never raises, whatever the text: a malformed response yields empty fields and
``format_ok = False``, and the rollout decides what that costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ACTION_SEPARATOR = "||"

#: Responses longer than this are cut before parsing; no turn budget comes near it.
_MAX_CHARS = 100_000


@dataclass
class ParsedResponse:
    """The fields of one response; missing fields are empty strings."""

    think: str = ""
    observation: str = ""
    prediction: str = ""
    answer: str = ""
    actions: list[str] = field(default_factory=list)
    format_ok: bool = False


def _first(tag: str, text: str) -> tuple[str, bool]:
    """Content of the first ``<tag>...</tag>`` in ``text`` and whether there was one.

    Plain ``str.find`` rather than a regex: ``<tag>(.*?)</tag>`` rescans the rest of
    the text from every unclosed opening tag, which is quadratic on adversarial input.
    A model that repeats a tag is judged on its first use.
    """
    start = text.find(f"<{tag}>")
    if start < 0:
        return "", False
    start += len(tag) + 2
    end = text.find(f"</{tag}>", start)
    return (text[start:end].strip(), True) if end >= 0 else ("", False)


def split_actions(answer: str) -> list[str]:
    """The actions an answer names: split on ``||``, stripped, empty ones dropped."""
    return [a.strip() for a in answer.split(ACTION_SEPARATOR) if a.strip()]


def parse_response(
    text: str, *, world_model: bool = False, max_actions: int | None = None
) -> ParsedResponse:
    """Split ``text`` into its fields.

    ``format_ok`` is true when think and answer blocks are present (and, with
    ``world_model``, observation and prediction inside think) and the answer names at
    least one action. Actions are the answer split on ``||``; with ``max_actions`` only
    the first ones are kept.
    """
    if not isinstance(text, str):
        return ParsedResponse()
    text = text[:_MAX_CHARS]
    think, has_think = _first("think", text)
    answer, has_answer = _first("answer", text)
    observation, has_obs = _first("observation", think)
    prediction, has_pred = _first("prediction", think)
    actions = split_actions(answer)
    if max_actions is not None:
        actions = actions[:max_actions]
    format_ok = has_think and has_answer and bool(actions)
    if world_model:
        format_ok = format_ok and has_obs and has_pred
    return ParsedResponse(think, observation, prediction, answer, actions, format_ok)
