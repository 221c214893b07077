import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from spa.models import loading
from spa.models.loading import load_model


@pytest.mark.slow
def test_default_model_loads_from_package_and_cache_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("SPA_HOME", str(tmp_path))
    model, tokenizer = load_model("smollm2-135m-instruct")
    target = tmp_path / "models" / "smollm2-135m-instruct"
    assert (target / "model.safetensors").is_file()
    stamp = json.loads((target / "spa_converted.json").read_text())
    assert stamp["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert model.dtype == loading.resolve_dtype("auto")  # bf16 where native, else fp32
    assert getattr(model, "hf_quantizer", None) is None
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None

    def no_conversion(*args, **kwargs):
        raise AssertionError("the cached folder should have been reused")

    monkeypatch.setattr(loading, "convert_gguf", no_conversion)
    model2, _ = load_model("smollm2-135m-instruct", dtype="fp32")
    assert getattr(model2, "hf_quantizer", None) is None
    for (name, p1), (_, p2) in zip(model.named_parameters(), model2.named_parameters()):
        torch.testing.assert_close(p1.float(), p2.to(model.dtype).float(), msg=name)


@pytest.mark.slow
def test_default_model_generates_text(smollm):
    model, tokenizer = smollm
    messages = [
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "user", "content": "Say hello."}],
    ]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", padding=True, return_dict=True
    )
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    texts = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "4" in texts[0]
    assert all(text.strip() for text in texts)


def test_interrupted_conversion_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPA_HOME", str(tmp_path))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", interrupted)
    with pytest.raises(KeyboardInterrupt):
        loading.default_model_path()
    models_dir = tmp_path / "models"
    assert [p for p in models_dir.iterdir() if p.is_dir()] == []  # neither the target nor a temporary folder


def test_processes_starting_together_convert_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SPA_HOME", str(tmp_path))
    calls = []

    def slow_conversion(source, target, stamp):
        calls.append(target)
        time.sleep(0.3)  # long enough for the other caller to arrive while it runs
        target.mkdir(parents=True)
        (target / "spa_converted.json").write_text(json.dumps(stamp))

    monkeypatch.setattr(loading, "convert_gguf", slow_conversion)
    with ThreadPoolExecutor(2) as pool:  # flock excludes separate open()s, threads included
        paths = list(pool.map(lambda _: loading.default_model_path(), range(2)))
    assert len(calls) == 1 and paths[0] == paths[1] == calls[0]


def test_tiny_model_generates(tiny):
    model, tokenizer = tiny
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    inputs = tokenizer(["hello there", "hi"], return_tensors="pt", padding=True)
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape == (2, inputs["input_ids"].shape[1] + 5)


@pytest.mark.parametrize("name", ["no-such-model", "someorg/no-such-model"])
def test_unknown_name_lists_builtins_without_hanging(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="smollm2-135m-instruct, tiny") as error:
        load_model(name)
    assert "not on this machine" in str(error.value)


def test_missing_local_path_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="built-in names"):
        load_model(str(tmp_path / "missing"))


def test_bad_dtype_lists_valid_ones():
    with pytest.raises(ValueError, match="precision 'int3' is not known; valid: auto, bf16, fp16, fp32"):
        loading.resolve_dtype("int3")


def test_a_cache_stamped_with_the_source_path_stays_valid(tmp_path, monkeypatch):
    monkeypatch.setenv("SPA_HOME", str(tmp_path))
    source = loading.gguf_source()
    target = tmp_path / "models" / "smollm2-135m-instruct"
    target.mkdir(parents=True)
    marker = target / "spa_converted.json"
    marker.write_text(json.dumps({"source": f"/elsewhere/venv/{source.name}", "size": source.stat().st_size}))

    def no_conversion(*args, **kwargs):
        raise AssertionError("the cached folder should have been reused")

    monkeypatch.setattr(loading, "convert_gguf", no_conversion)
    assert loading.default_model_path() == target
    marker.write_text(json.dumps({"source": str(source), "size": 1}))  # another file: converted again
    with pytest.raises(AssertionError, match="reused"):
        loading.default_model_path()


def test_loading_and_saving_draw_no_progress_bar_into_a_log(tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    from spa.progress import quiet_hf_bars

    model, tokenizer = load_model("tiny", dtype="fp32")
    capfd.readouterr()
    with quiet_hf_bars():  # as the trainers save checkpoints
        model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    loaded, _ = load_model(str(tmp_path / "m"), dtype="fp32")  # stderr is captured: not a tty
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "Writing model shards" not in err
    assert hf_logging.is_progress_bar_enabled()  # restored afterwards
    for (name, p1), (_, p2) in zip(model.named_parameters(), loaded.named_parameters()):
        torch.testing.assert_close(p1, p2, msg=name)


def test_a_model_goes_to_the_gpu_where_there_is_one_unless_told_otherwise(monkeypatch):
    # "meta" stands in for a GPU: on a GPU machine a caller that names no device must
    # train and play there, not on the CPU.
    real = loading.resolve_device
    monkeypatch.setattr(loading, "resolve_device",
                        lambda device: torch.device("meta") if device in (None, "auto") else real(device))
    lm, _ = loading.load_model("tiny", dtype="fp32")
    assert next(lm.parameters()).device.type == "meta"
    lm, _ = loading.load_model("tiny", dtype="fp32", device="cpu")
    assert next(lm.parameters()).device.type == "cpu"


def test_the_two_transformers_renames_do_not_warn_the_user():
    # A process of its own: pytest resets the warning filters around every test, and what
    # counts is what a command prints.
    script = """
import copy, warnings, torch
from spa.models import load_model
from spa.models.lora import add_lora
model, _ = load_model("tiny", dtype="fp32")
add_lora(copy.deepcopy(model), rank=2)  # peft reads model.is_gradient_checkpointing
model(input_ids=torch.tensor([[1, 2, 3]]), past_key_values=None)  # the cache's old name
warnings.warn("`something_else` is deprecated", FutureWarning)
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "is_gradient_checkpointing" not in result.stderr and "past_key_values" not in result.stderr
    assert "`something_else` is deprecated" in result.stderr  # other warnings still show
