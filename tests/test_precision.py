"""The compute precision is chosen from the hardware: mocked CPU kinds and CUDA."""

import io

import pytest
import torch

from spa import precision
from spa.config import ConfigError, load
from spa.pipeline.recipe import Recipe
from spa.rl.config import PPOConfig
from spa.rl.rwml_config import RWMLConfig
from spa.worldmodel.sft import SFTConfig


@pytest.fixture
def cpu_kind(monkeypatch):
    """``cpu_kind(capability, bf16, amx)`` makes this CPU look like another kind."""

    def set_kind(capability: str, bf16: bool, amx: bool = False, amx_fp16: bool = False):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: amx_fp16)

    return set_kind


def test_auto_on_a_cpu_without_native_bf16_is_fp32(cpu_kind):
    cpu_kind("AVX2", bf16=False)
    chosen = precision.resolve("auto", "cpu")
    assert (chosen.name, chosen.dtype, chosen.low) == ("fp32", torch.float32, False)
    assert "no native bf16" in chosen.reason and not chosen.warning


def test_auto_on_zen4_or_sapphire_rapids_is_bf16(cpu_kind):
    cpu_kind("AVX512", bf16=True)
    assert precision.resolve("auto", "cpu").name == "bf16"
    cpu_kind("AVX512", bf16=False, amx=True)
    assert precision.resolve("auto", "cpu").name == "bf16"


def test_avx512_without_bf16_or_with_kernels_capped_at_avx2_is_fp32(cpu_kind):
    cpu_kind("AVX512", bf16=False)  # Skylake / Ice Lake: AVX-512 but bf16 emulated
    assert precision.resolve("auto", "cpu").name == "fp32"
    cpu_kind("AVX2", bf16=True)  # ATEN_CPU_CAPABILITY=avx2 on a bf16 CPU
    assert precision.resolve("auto", "cpu").name == "fp32"


def test_explicit_precision_is_obeyed_and_warned_about_where_emulated(cpu_kind):
    cpu_kind("AVX2", bf16=False)
    slow = precision.resolve("bf16", "cpu")
    assert slow.name == "bf16" and "emulated" in slow.warning
    assert "emulated" in precision.resolve("fp16", "cpu").warning
    assert not precision.resolve("fp32", "cpu").warning
    cpu_kind("AVX512", bf16=True)
    assert not precision.resolve("bf16", "cpu").warning
    assert precision.resolve("float32", "cpu").name == "fp32"  # aliases


def test_cuda_picks_bf16_where_the_gpu_has_it(monkeypatch):
    monkeypatch.setattr(precision, "cuda_has_bf16", lambda device: True)
    assert precision.resolve("auto", "cuda").name == "bf16"
    monkeypatch.setattr(precision, "cuda_has_bf16", lambda device: False)
    chosen = precision.resolve("auto", "cuda")
    assert chosen.name == "fp32" and "GPU" in chosen.reason
    assert "emulated" in precision.resolve("bf16", "cuda").warning


def test_unknown_precision_names_it_and_the_valid_ones():
    with pytest.raises(ValueError, match="precision 'int8' is not known; valid: auto, bf16, fp16, fp32"):
        precision.resolve("int8")


def test_announce_prints_once_with_the_warning(cpu_kind, monkeypatch):
    monkeypatch.setattr(precision, "_announced", set())
    cpu_kind("AVX2", bf16=False)
    out = io.StringIO()
    precision.announce(precision.resolve("auto", "cpu"), file=out)
    precision.announce(precision.resolve("auto", "cpu"), file=out)
    assert out.getvalue() == "compute: fp32 (this CPU (AVX2) has no native bf16)\n"
    out = io.StringIO()
    precision.announce(precision.resolve("bf16", "cpu"), file=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "compute: bf16 (asked for)" and lines[1].startswith("warning: bf16 was asked for")


def test_announce_is_silent_on_the_other_processes_of_a_launch(cpu_kind, monkeypatch):
    monkeypatch.setattr(precision, "_announced", set())
    cpu_kind("AVX2", bf16=False)
    out = io.StringIO()
    monkeypatch.setenv("RANK", "1")
    precision.announce(precision.resolve("auto", "cpu"), file=out)
    assert out.getvalue() == ""
    monkeypatch.setenv("RANK", "0")
    precision.announce(precision.resolve("auto", "cpu"), file=out)
    assert out.getvalue().startswith("compute: fp32")


def test_autocast_matches_the_precision():
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    with precision.Precision("bf16", "test").autocast("cpu"):
        assert (x @ w).dtype == torch.bfloat16
    with precision.Precision("fp32", "test").autocast("cpu"):
        assert (x @ w).dtype == torch.float32
    assert precision.Precision("fp32", "test").decode_dtype is None
    assert precision.Precision("bf16", "test").decode_dtype == torch.bfloat16


@pytest.mark.parametrize("schema, path", [(SFTConfig, "sft"), (PPOConfig, "ppo"), (RWMLConfig, "rwml")])
def test_the_old_bf16_key_is_an_error_naming_the_new_one(schema, path):
    with pytest.raises(ConfigError, match="'bf16' was replaced by 'precision'"):
        load(schema, {}, ["bf16=false"])
    with pytest.raises(ConfigError, match=rf"'{path}.bf16' was replaced by '{path}.precision'"):
        load(Recipe, {path: {"bf16": True}})
    assert load(schema, {}, ["precision=fp32"]).precision == "fp32"
    assert schema().precision == "auto"
    with pytest.raises(ConfigError, match="precision 'fp8' is not known"):
        load(schema, {}, ["precision=fp8"])


def test_a_stage_inherits_the_recipe_precision_unless_it_sets_its_own():
    recipe = load(Recipe, {"precision": "fp32", "ppo": {"precision": "bf16"}})
    assert recipe.stage_precision(recipe.sft) == "fp32"
    assert recipe.stage_precision(recipe.ppo) == "bf16"
    assert load(Recipe, {}).stage_precision(Recipe().rwml) == "auto"
