"""The device and precision a command computes in: named, mapped under a launcher, decided once.

No GPU is needed: ``gpus(n)`` makes torch report n CUDA GPUs and records the calls that
would make one current.
"""

import dataclasses
import io
import os

import pytest
import torch

from spa import compute, precision
from spa.compute import Compute


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n, current=0)`` makes torch see ``n`` CUDA GPUs (0: none), each with native
    bf16; returns the list of devices ``torch.cuda.set_device`` was called with."""
    claimed = []
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "")  # restored after the test, whatever decide sets
    monkeypatch.setattr(precision, "_announced", set())

    def see(count: int, current: int = 0) -> list:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
        monkeypatch.setattr(torch.cuda, "set_device", claimed.append)
        monkeypatch.setattr(precision, "cuda_has_bf16", lambda device: True)
        return claimed

    return see


def test_device_names_are_checked_and_written_one_way():
    assert [compute.check_device(name) for name in ("auto", "CPU", " cuda ", "cuda:01", torch.device("cuda", 2))] \
        == ["auto", "cpu", "cuda", "cuda:1", "cuda:2"]
    for bad in ("gpu", "cuda:x", "cuda:-1", "cuda:", "mps", "", "0"):
        with pytest.raises(ValueError, match=rf"device '{bad}' is not known; valid: auto, cpu, cuda, cuda:N"):
            compute.check_device(bad)


def test_without_a_gpu_auto_is_the_cpu_and_a_gpu_is_an_error(gpus):
    gpus(0)
    assert compute.resolve_device("auto") == compute.resolve_device("cpu") == torch.device("cpu")
    for name in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match=f"device '{name}' was asked for, but torch sees no CUDA GPU here; "
                                             "valid here: auto, cpu"):
            compute.resolve_device(name)


def test_with_gpus_auto_and_cuda_are_the_current_one_and_an_index_must_exist(gpus):
    gpus(2, current=1)
    assert compute.resolve_device("auto") == compute.resolve_device("cuda") == torch.device("cuda", 1)
    assert compute.resolve_device("cuda:0") == torch.device("cuda", 0)
    assert compute.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device 'cuda:2' was asked for, but torch sees 2 GPU\(s\): cuda:0 to cuda:1"):
        compute.resolve_device("cuda:2")


def test_under_a_launcher_each_process_takes_the_gpu_of_its_local_rank(gpus, monkeypatch):
    gpus(4)
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert {compute.resolve_device(name) for name in ("auto", "cuda", "cuda:2")} == {torch.device("cuda", 2)}
    assert compute.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device 'cuda:0' under a launcher: each process takes the GPU of its "
                                         r"LOCAL_RANK \(cuda:2 here\); use auto or cuda"):
        compute.resolve_device("cuda:0")
    monkeypatch.setenv("LOCAL_RANK", "5")
    with pytest.raises(ValueError, match=r"LOCAL_RANK=5 asks for cuda:5, but torch sees 4 GPU\(s\)"):
        compute.resolve_device("auto")
    gpus(0)  # a launcher of CPU processes (gloo)
    assert compute.resolve_device("auto") == torch.device("cpu")


def test_accelerates_cpu_switch_keeps_auto_on_the_cpu(gpus, monkeypatch):
    gpus(2)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    assert compute.resolve_device("auto") == torch.device("cpu")
    assert compute.resolve_device("cuda") == torch.device("cuda", 0)  # asked for by name


def test_decide_makes_the_gpu_current_and_says_where_and_in_what_it_computes(gpus, monkeypatch, capsys):
    claimed = gpus(4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    chosen = compute.decide("auto", "auto")
    assert (chosen.device, chosen.precision.name, chosen.dtype) == (torch.device("cuda", 3), "bf16", torch.bfloat16)
    assert claimed == [torch.device("cuda", 3)]
    assert capsys.readouterr().err == "compute: bf16 on cuda:3 (this GPU supports bf16)\n"
    with pytest.raises(dataclasses.FrozenInstanceError):
        chosen.device = torch.device("cpu")
    with pytest.raises(ValueError, match="device 'cuda:1' under a launcher"):
        compute.decide("cuda:1")
    with pytest.raises(ValueError, match="precision 'int8' is not known"):
        compute.decide("auto", "int8")
    assert claimed == [torch.device("cuda", 3)]  # a refused choice claims nothing


def test_the_cpu_under_a_launcher_switches_accelerate_to_cpu_processes(gpus, monkeypatch):
    claimed = gpus(2)
    assert compute.decide("cpu").device == torch.device("cpu")
    assert os.environ["ACCELERATE_USE_CPU"] == ""  # alone, nothing to tell accelerate
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert compute.decide("cpu").device == torch.device("cpu")
    assert os.environ["ACCELERATE_USE_CPU"] == "true" and claimed == []
    assert compute.resolve_device("auto") == torch.device("cpu")  # the process group will agree


def test_auto_precision_on_the_cpu_is_still_chosen_by_the_cpu(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert compute.decide("cpu", "auto").precision.name == "fp32"  # an AVX2 machine
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert compute.decide("cpu", "auto").precision.name == "bf16"
    assert compute.decide("cpu", "bfloat16").precision == precision.Precision("bf16", "asked for")


def test_a_compute_autocasts_and_decodes_in_its_precision_on_its_device():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    low = Compute(torch.device("cpu"), precision.Precision("bf16", "test"))
    with low.autocast():
        assert (x @ w).dtype == torch.bfloat16
    assert (low.dtype, low.decode_dtype) == (torch.bfloat16, torch.bfloat16)
    full = low.with_precision("fp32")
    with full.autocast():
        assert (x @ w).dtype == torch.float32
    assert (full.device, full.dtype, full.decode_dtype) == (torch.device("cpu"), torch.float32, None)


def test_a_model_without_a_decided_compute_gets_its_own_device(tiny, monkeypatch, capsys):
    model, _ = tiny
    monkeypatch.setattr(precision, "_announced", set())
    chosen = compute.for_model(model, "fp32")
    assert chosen == Compute(torch.device("cpu"), precision.Precision("fp32", "asked for"))
    assert capsys.readouterr().err == "compute: fp32 on cpu (asked for)\n"
    compute.announce(chosen, file=io.StringIO())
    assert capsys.readouterr().err == ""  # once per process
