"""The benchmarks run end to end on the tiny model and print their JSON."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "generation.py"
SFT_BENCH = BENCH.with_name("sft.py")
RL_BENCH = BENCH.with_name("rl_step.py")


def bench_json(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout
    return json.loads(out[out.index("{"):])


def test_generation_bench_prints_ratio_and_profile():
    cmd = [sys.executable, str(BENCH), "--model", "tiny", "--dtype", "fp32", "--batch", "4",
           "--new-tokens", "4", "--profile"]
    result = bench_json(cmd)
    assert result["engine"]["path"] == "llama fast path"
    assert result["dtype"] == "fp32" and result["dtype_reason"] == "asked for"
    assert result["cpu_capability"] in ("AVX512", "AVX2", "DEFAULT") and result["packed_linear"]
    assert result["speedup"] > 0 and result["hf_generate"]["tokens_per_s"] > 0
    profile = result["engine_profile"]
    assert set(profile["phases_s"]) == {"prefill", "step", "sample", "host_other"}
    assert profile["phases_s"]["step"] > 0 and profile["phases_s"]["prefill"] > 0
    assert profile["ops_s"]["linear"] > 0 and profile["ops_s"]["attention_matmul"] > 0
    # host_other is the run's time outside the labelled phases: a label counted twice, or
    # nested in another, would make it negative
    assert profile["phases_s"]["host_other"] >= -0.005


def test_generation_bench_sweeps_batch_sizes():
    result = bench_json([sys.executable, str(BENCH), "--model", "tiny", "--dtype", "fp32", "--batch", "1", "3",
                         "--new-tokens", "2", "--skip-hf", "--no-overlap"])
    assert [run["batch"] for run in result["runs"]] == [1, 3] and "batch" not in result
    assert all(run["engine"]["tokens_per_s"] > 0 and run["engine"]["overlap"] is False for run in result["runs"])
    assert result["new_tokens"] == 2 and result["dtype"] == "fp32"
    bad = subprocess.run([sys.executable, str(BENCH), "--model", "tiny", "--batch", "0"], capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode == 2 and "0 is not a batch size" in bad.stderr


def test_benchmarks_choose_the_precision_by_default_and_say_what_they_ran_on():
    from spa import precision

    expected = precision.resolve("auto", "cpu").name
    result = bench_json([sys.executable, str(BENCH), "--model", "tiny", "--batch", "2", "--new-tokens", "2",
                         "--skip-hf", "--no-pack"])
    assert result["dtype"] == expected and not result["packed_linear"]
    assert result["cpu_capability"] == precision.cpu_capability()
    result = bench_json([sys.executable, str(SFT_BENCH), "--model", "tiny", "--batches", "1", "--batch-size", "2"])
    assert result["dtype"] == expected and result["cpu_capability"] == precision.cpu_capability()
    assert result["speedup"] > 0


def test_rl_step_bench_times_both_paths_from_a_cached_bootstrap(tmp_path, monkeypatch):
    from spa import precision
    from spa.models.loading import default_model_path

    # a fresh cache root, so the bootstrap is built here, not in the user's cache; the
    # converted default model (the tiny model's tokenizer) is shared through a link
    real_models = default_model_path().parent
    (tmp_path / "models").symlink_to(real_models, target_is_directory=True)
    monkeypatch.setenv("SPA_HOME", str(tmp_path))
    small = [sys.executable, str(RL_BENCH), "--model", "tiny", "--steps", "1", "--groups", "2", "--samples", "2",
             "--max-turns", "1", "--bootstrap-episodes", "2", "--max-new-tokens", "8"]
    # the tiny model never writes the format: train its flat groups too, so every phase runs
    result = bench_json(small + ["--baseline-set", "max_new_tokens=16", "--spa-set", "drop_flat_groups=false"])
    assert result["dtype"] == precision.resolve("auto", "cpu").name and result["dtype_reason"]
    assert result["cpu_capability"] == precision.cpu_capability() and "cpu_native_bf16" in result
    assert result["start"]["kind"] == "bootstrap" and not result["start"]["cached"]
    assert result["start"]["modes"] == ["world_model", "base"] and result["start"]["examples"] == 4
    assert Path(result["start"]["path"]).parent == tmp_path / "bench"
    assert result["episodes"]["per_step"] == 4 and result["steps"] == {"warmup": 1, "timed": 1}
    base, spa = result["configs"]["baseline"], result["configs"]["spa"]
    assert base["settings"]["algorithm"] == "ppo" and base["settings"]["mode"] == "world_model"
    assert base["settings"]["state_tokens_in_loss"] and not base["settings"]["drop_flat_groups"]
    assert spa["settings"]["algorithm"] == "grpo" and spa["settings"]["mode"] == "base"
    assert (base["settings"]["max_new_tokens"], spa["settings"]["max_new_tokens"]) == (16, 8)
    phases = {"rollout", "old_logprobs", "lookahead", "advantages", "actor_update", "critic_update", "other"}
    for side in (base, spa):
        assert set(side["phases_s"]) == phases and side["phases_s"]["old_logprobs"] == 0
        assert side["phases_s"]["rollout"] > 0 and side["phases_s"]["actor_update"] > 0
        # "other" is the step's time outside the timed phases: a phase counted twice makes it negative
        assert side["phases_s"]["other"] >= -0.005
        assert side["episodes_per_hour"] > 0 and side["updated_steps"] == 1 and "note" not in side
        assert 0 < side["generated_tokens_per_step"] <= 4 * side["settings"]["max_new_tokens"]
        assert side["trained_tokens_per_step"] > side["generated_tokens_per_step"]  # prompts + responses
    assert base["phases_s"]["critic_update"] > 0 and spa["phases_s"]["critic_update"] == 0
    # the default learner's Monte-Carlo look-ahead is timed and given as a share of the step
    assert spa["settings"]["advantage"] == "mc" and not spa["settings"]["critic"]
    assert spa["phases_s"]["lookahead"] > 0 and 0 < spa["lookahead_share"] < 1
    assert base["phases_s"]["lookahead"] == 0 and base["lookahead_share"] == 0
    assert result["speedup"] > 0 and result["warnings"] == []
    # the bootstrap is reused, and one side alone gives no ratio
    again = bench_json(small + ["--only", "spa"])
    assert again["start"]["cached"] and again["start"]["path"] == result["start"]["path"]
    assert set(again["configs"]) == {"spa"} and again["speedup"] is None


def test_matmul_bench_times_each_precision_and_names_the_auto_choice():
    from spa import precision

    result = bench_json([sys.executable, str(BENCH.with_name("matmul.py")), "--size", "64", "--seconds", "0.05"])
    assert result["auto"] == precision.resolve("auto", "cpu").name
    assert result["cpu_native_bf16"] == precision.cpu_has_native_bf16()
    assert set(result["gflops"]) == {"fp32", "bf16", "fp16"} and min(result["gflops"].values()) > 0
    assert result["ratio_to_fp32"]["fp32"] == 1.0


def test_sft_memory_bench_trains_each_setting_in_its_own_process():
    result = bench_json([sys.executable, str(BENCH.with_name("sft_memory.py")), "--model", "tiny", "--steps", "2",
                         "--batch-size", "2", "--episodes", "2", "--trim-every", "0,1,1,0"])
    assert [s["trim_every_steps"] for s in result["settings"]] == [0, 1, 1, 0]
    assert all(s["tokens_per_second"] > 0 and s["minor_page_faults"] >= 0 for s in result["settings"])
    assert result["settings"][0]["tokens_per_second_ratio"] == 1.0
    never, every = result["by_setting"]
    assert (never["trim_every_steps"], never["runs"], every["trim_every_steps"], every["runs"]) == (0, 2, 1, 2)
    speeds = {k: [s["tokens_per_second"] for s in result["settings"] if s["trim_every_steps"] == k] for k in (0, 1)}
    assert every["tokens_per_second_mean"] == round(sum(speeds[1]) / 2, 1)
    assert every["tokens_per_second_ratio"] == round(sum(speeds[1]) / sum(speeds[0]), 3)
    assert never["tokens_per_second_ratio"] == 1.0
    bad = subprocess.run([sys.executable, str(BENCH.with_name("sft_memory.py")), "--trim-every", "0,-1"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "--trim-every '0,-1'" in bad.stderr


GPU_CHECK = BENCH.with_name("gpu_check.sh")


def gpu_check_module():
    """bench/gpu_check.py as a module (bench/ is no package)."""
    import importlib.util

    if "gpu_check" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_check", BENCH.with_name("gpu_check.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_check"] = module  # its dataclass looks its module up while being built
        spec.loader.exec_module(module)
    return sys.modules["gpu_check"]


def test_gpu_check_smoke_runs_generation_rl_and_spa_run_on_the_cpu(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    done = subprocess.run(["bash", str(GPU_CHECK), "--cpu-smoke", "--archs", "qwen2.5-0.5b"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout[done.stdout.index("{"):])
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == result  # $OUT gets the same JSON
    assert "===== spa_run" in (tmp_path / "gpu_check.log").read_text()
    assert result["mode"] == "cpu-smoke" and result["gpu"] is None and result["failed_parts"] == []
    assert result["torch"] and result["transformers"] and result["seconds"] > 0
    assert list(result["parts"]) == ["models", "generation/qwen2.5-0.5b", "rl/qwen2.5-0.5b", "spa_run"]
    assert all(part["ok"] and part["seconds"] > 0 and "gpu" in part for part in result["parts"].values())
    # spa_run's model is written too, though --archs leaves it out
    models = result["parts"]["models"]["result"]["models"]
    assert set(models) == {"smollm2-135m", "qwen2.5-0.5b"}
    qwen = models["qwen2.5-0.5b"]
    assert qwen["config"]["model_type"] == "qwen2" and qwen["config"]["vocab_size"] == 151936
    assert qwen["config"]["rope_theta"] == 1e6 and qwen["config"]["rms_norm_eps"] == 1e-6
    assert qwen["small"] and qwen["fits_vocabulary"] and qwen["parameters_millions"] > 0

    generation = result["parts"]["generation/qwen2.5-0.5b"]["summary"]
    assert set(generation["batches"]) == {"2", "3"} and generation["dtype"] == "fp32"
    for batch in generation["batches"].values():
        assert batch["engine_tokens_per_s"] > 0 and batch["hf_tokens_per_s"] > 0 and batch["ratio"] > 0
        assert batch["engine_path"] == "llama fast path"  # Qwen2 takes the engine's fast path

    rl = result["parts"]["rl/qwen2.5-0.5b"]["summary"]
    assert rl["ppo"]["critic"] and not rl["grpo"]["critic"]
    for side in (rl["ppo"], rl["grpo"]):
        assert side["step_seconds"] > 0 and side["warmup_step_seconds"] > 0 and side["trained_tokens_per_step"] > 0
        assert side["peak_gpu_memory_gib"] is None  # a GPU-only number
    assert result["parts"]["rl/qwen2.5-0.5b"]["result"]["device"] == "cpu"

    run = result["parts"]["spa_run"]
    assert run["arch"] == "smollm2-135m" and any("on cpu" in line for line in run["compute"])
    assert run["result"]["completed"] and "device=cpu" in run["result"]["overrides"]
    stages = run["result"]["stages_s"]
    assert {"bootstrap", "eval_base", "rl", "eval_final", "report"} <= set(stages)
    assert stages["rl"] > 0 and stages["bootstrap"] > 0
    utilisation = run["result"]["utilisation"]  # nvidia-smi's, where a machine has one
    assert utilisation is None or utilisation["samples"] > 0


def test_gpu_check_records_a_failing_part_and_goes_on(tmp_path):
    check = gpu_check_module()
    failed = check.run_part("bad", [sys.executable, "-c", "import sys; print('oops', file=sys.stderr); sys.exit(3)"],
                            timeout=60)
    assert not failed["ok"] and failed["error"] == "exit status 3" and "oops" in failed["stderr_tail"]
    slow = check.run_part("slow", [sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
    assert not slow["ok"] and slow["error"] == "timed out after 1 s" and slow["seconds"] < 10
    silent = check.run_part("silent", [sys.executable, "-c", "print('no json')"], timeout=60)
    assert not silent["ok"] and silent["error"].startswith("no JSON result")
    fine = check.run_part("fine", [sys.executable, "-c", "print('noise'); print('{\"a\": 1}')"], timeout=60,
                          log_file=tmp_path / "log")
    assert fine["ok"] and fine["result"] == {"a": 1} and "===== fine" in (tmp_path / "log").read_text()
    # a spent budget skips the parts, each with its reason, and the report still comes whole
    plan = dataclasses.replace(check.SMOKE_PLAN, budget=1.0, tokenizer="unused")
    report = check.check(plan, ["generation", "run"], ["qwen2.5-0.5b"], "smollm2-135m", tmp_path / "out")
    assert report["failed_parts"] == ["models", "generation/qwen2.5-0.5b", "spa_run"]
    assert report["parts"]["models"]["error"].startswith("skipped:")
    assert report["parts"]["spa_run"]["error"] == "skipped: no model folder of smollm2-135m"
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text()) == report


def test_gpu_check_schedule_and_utilisation_summary():
    check = gpu_check_module()
    order = check.schedule(list(check.PARTS), list(check.ARCHS), "smollm2-135m")
    assert order == [("models", "smollm2-135m,qwen2.5-0.5b"), ("generation", "smollm2-135m"),
                     ("generation", "qwen2.5-0.5b"), ("rl", "qwen2.5-0.5b"), ("run", "smollm2-135m"),
                     ("rl", "smollm2-135m")]  # the 0.5B model's RL before the run, the 135M's last
    rows = ["0, 0, 500", "1, 99, 10", "0, 40, 900", "garbage", "0, 80, 1200", "0, 0, 1200", "0, [N/A], 3"]
    summary = check.utilisation_summary(rows)
    assert summary["samples"] == 4 and summary["mean"] == 30.0 and summary["median"] == 20.0
    assert summary["max"] == 80 and summary["memory_used_mib_max"] == 1200  # GPU 1's row is left out
    assert summary["busy_stretch_samples"] == 2 and summary["busy_stretch_mean"] == 60.0
    assert check.utilisation_summary(["0, 0, 1", "0, 0, 1"])["busy_stretch_samples"] == 0
    assert check.utilisation_summary([]) is None


def test_gpu_check_builds_smollm2_as_the_default_model_config_says():
    from transformers import AutoConfig, AutoTokenizer

    from spa.models.loading import default_model_path, prepare_tokenizer

    check = gpu_check_module()
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(default_model_path()))
    built = check.architecture("smollm2-135m", tokenizer, small=False)
    shipped = AutoConfig.from_pretrained(default_model_path())
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "tie_word_embeddings",
                "hidden_act", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(built, key) == getattr(shipped, key), key
    assert abs(built.rms_norm_eps - shipped.rms_norm_eps) < 1e-9
    assert check.rope_theta(built) == check.rope_theta(shipped) == 1e5
    qwen = check.architecture("qwen2.5-0.5b", tokenizer, small=False)
    assert (qwen.hidden_size, qwen.num_hidden_layers, qwen.num_attention_heads, qwen.num_key_value_heads,
            qwen.intermediate_size, qwen.vocab_size) == (896, 24, 14, 2, 4864, 151936)
    assert qwen.tie_word_embeddings and check.rope_theta(qwen) == 1e6 and len(tokenizer) <= qwen.vocab_size
