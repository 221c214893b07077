"""Two jobs on one machine: one after the other on every core, or side by side on one core each?

Runs the same command twice both ways and prints JSON: the wall time of each layout and
the speed-up of sharing (serial wall time / parallel wall time; above 1 means two runs
side by side, each on ``cores / 2`` threads, finish sooner than the same two one after the
other on all cores). Small batched decoding and SFT steps of a 135M model use two cores
poorly, so sharing can pay; whether it does is measured here, on this machine.

    python bench/sharing.py -- spa eval -e frozenlake -m runs/X/sft/epoch-3 --mode base \\
        --levels 32 --samples 4 --max-new-tokens 64 --out {out}
    python bench/sharing.py --cores 2 -- python bench/sft.py --data runs/X/data/selfplay.jsonl

``{out}`` in the command becomes a fresh folder per job, so that two jobs never write the
same files. The threads are set through ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``,
which torch reads at start-up. Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch


def _env(threads: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _commands(command: list[str], root: str, layout: str) -> list[list[str]]:
    return [[part.replace("{out}", os.path.join(root, f"{layout}-{i}")) for part in command] for i in range(2)]


def run(command: list[str], cores: int) -> dict:
    """Wall seconds of two copies of ``command``: serially on ``cores`` threads each, then in
    parallel on ``cores // 2`` threads each."""
    if cores < 2:
        raise ValueError(f"--cores {cores}: sharing needs at least 2 cores")
    with tempfile.TemporaryDirectory() as root:
        start = time.perf_counter()
        for cmd in _commands(command, root, "serial"):
            subprocess.run(cmd, env=_env(cores), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        serial = time.perf_counter() - start
        start = time.perf_counter()
        jobs = [subprocess.Popen(cmd, env=_env(cores // 2), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for cmd in _commands(command, root, "parallel")]
        codes = [job.wait() for job in jobs]
        parallel = time.perf_counter() - start
    if any(codes):
        raise RuntimeError(f"a parallel job failed (exit codes {codes}): {' '.join(command)}")
    return {"command": " ".join(command), "cores": cores, "serial_seconds": round(serial, 1),
            "parallel_seconds": round(parallel, 1), "sharing_speedup": round(serial / parallel, 3),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": platform.processor() or None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="Cores of the machine (default: all).")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="The job, after `--`.")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the job's command after --")
    print(json.dumps(run(command, args.cores), indent=2))


if __name__ == "__main__":
    sys.exit(main())
