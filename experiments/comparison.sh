#!/usr/bin/env bash
# The comparison of README "The comparison": every method from a format bootstrap in its
# own prompt, the same RL stage (expert iteration with the solver's per-turn label, three
# rounds), learn preset, 128 x 8 evaluation, seeds 0-2, on FrozenLake 4x4 and Sokoban 6x6,
# then the paper's SPA ablations (one seed each).
#
#   experiments/comparison.sh [frozenlake|sokoban] ...   # default: frozenlake
#
# Two lanes run side by side, one core each (bench/sharing.py: 1.37x the throughput of one
# run on both cores for evaluation, 1.07x for SFT, Zen 4). Every `spa run` resumes where it
# stopped, so the same command after an interruption goes on; a run archived as finished
# is skipped, even without its run folder. Logs: runs/comparison-ENV-laneN.log. Each
# finished run is archived into results/runs (spa archive); at the end results/comparison
# holds spa compare's table.
set -u
cd "$(dirname "$0")/.."
mkdir -p runs results/runs
SPA=${SPA:-.venv/bin/spa}
envs=("${@:-frozenlake}")

cell() {  # cell ENV METHOD SEED [ABLATION key=value ...]
  local env=$1 method=$2 seed=$3 name="$1-$2-iterate"
  shift 3
  if [ $# -gt 0 ]; then name="$name-$1"; shift; fi
  # Archived and finished: done, even where its run folder is gone (a fresh machine).
  if grep -qs '"report"' "results/runs/$name-s$seed/stages.json"; then return 0; fi
  "$SPA" run "configs/$env-$method-iterate.yaml" "seed=$seed" "$@" --name "$name-s$seed" &&
    "$SPA" archive "runs/$name-s$seed" --out results/runs
}

for env in "${envs[@]}"; do
  (
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
    for seed in 0 1 2; do cell "$env" spa "$seed"; done
    cell "$env" spa 0 self_belief selfplay.states=self_belief
    cell "$env" spa 0 random_exploration selfplay.exploration=random
  ) > "runs/comparison-$env-lane1.log" 2>&1 &
  (
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
    for seed in 0 1; do cell "$env" vanilla "$seed"; done
    cell "$env" state_estimation 0
    cell "$env" vanilla 2
    for seed in 1 2; do cell "$env" state_estimation "$seed"; done
    cell "$env" spa 0 random_coords selfplay.coords=random
    cell "$env" spa 0 masked_states sft.mask_states=true
  ) > "runs/comparison-$env-lane2.log" 2>&1 &
  wait
done
"$SPA" compare results/runs/* --out results/comparison
