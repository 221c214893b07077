"""The benchmarks run end to end on the tiny model and print their JSON."""

import json
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
