"""The generation benchmark runs end to end on the tiny model and prints its JSON."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "generation.py"


def test_generation_bench_prints_ratio_and_profile():
    cmd = [sys.executable, str(BENCH), "--model", "tiny", "--dtype", "fp32", "--batch", "4",
           "--new-tokens", "4", "--profile"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout
    result = json.loads(out[out.index("{"):])
    assert result["engine"]["path"] == "llama fast path"
    assert result["speedup"] > 0 and result["hf_generate"]["tokens_per_s"] > 0
    profile = result["engine_profile"]
    assert set(profile["phases_s"]) == {"prefill", "step", "sample", "host_other"}
    assert profile["phases_s"]["step"] > 0 and profile["phases_s"]["prefill"] > 0
    assert profile["ops_s"]["linear"] > 0 and profile["ops_s"]["attention_matmul"] > 0
    # host_other is the run's time outside the labelled phases: a label counted twice, or
    # nested in another, would make it negative
    assert profile["phases_s"]["host_other"] >= -0.005
