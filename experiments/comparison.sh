#!/usr/bin/env bash
# The comparison of README "The comparison": every method from a format bootstrap in its
# own prompt, the same RL stage (expert iteration with the solver's per-turn label, three
# rounds), learn preset, 128 x 8 evaluation, seeds 0-2, on FrozenLake 4x4 and Sokoban 6x6.
#
#   experiments/comparison.sh [frozenlake|sokoban] ...   # default: frozenlake
#
# Two lanes run side by side, one core each (bench/sharing.py: 1.37x the throughput of one
# run on both cores for evaluation, 1.07x for SFT, Zen 4). Every `spa run` resumes where it
# stopped, so the same command after an interruption goes on; finished runs are skipped in
# seconds. Logs: runs/comparison-ENV-laneN.log. At the end each lane's runs are archived
# into results/runs (spa archive) and compared into results/comparison (spa compare).
set -u
cd "$(dirname "$0")/.."
SPA=${SPA:-.venv/bin/spa}
envs=("${@:-frozenlake}")

cell() {  # cell ENV METHOD SEED
  "$SPA" run "configs/$1-$2-iterate.yaml" "seed=$3" --name "$1-$2-iterate-s$3" &&
    "$SPA" archive "runs/$1-$2-iterate-s$3" --out results/runs
}

for env in "${envs[@]}"; do
  (
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
    for seed in 0 1 2; do cell "$env" spa "$seed"; done
  ) > "runs/comparison-$env-lane1.log" 2>&1 &
  (
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
    for seed in 0 1; do cell "$env" vanilla "$seed"; done
    cell "$env" state_estimation 0
    cell "$env" vanilla 2
    for seed in 1 2; do cell "$env" state_estimation "$seed"; done
  ) > "runs/comparison-$env-lane2.log" 2>&1 &
  wait
done
"$SPA" compare results/runs/*-iterate-s* --out results/comparison
