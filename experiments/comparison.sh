#!/usr/bin/env bash
# The comparison of README "The comparison": every method from a format bootstrap in its
# own prompt, the same RL stage (expert iteration with the solver's per-turn label, three
# rounds), learn preset, 128 x 8 evaluation, seeds 0-2.
#
#   experiments/comparison.sh [GROUP ...]   # default: frozenlake
#
# GROUP is one of
#   frozenlake, sokoban     vanilla, state estimation and SPA, seeds 0-2 (the table's core);
#   ENV-ablations           the paper's four SPA ablations on ENV (frozenlake or sokoban), seed 0;
#   ENV-rows                RWML, and SPA playing its rounds in the world-model prompt, seeds 0-2;
#   sudoku                  vanilla and SPA on Sudoku 4x4, seeds 0-2;
#   frozenlake-transfer     vanilla and SPA trained on 4x4 lakes, RL and evaluation on 6x6,
#                           seeds 0-2.
# Groups run one after the other, in the order given.
#
# Two lanes run side by side, one core each (bench/sharing.py: 1.37x the throughput of one
# run on both cores for evaluation, 1.07x for SFT, Zen 4). Every `spa run` resumes where it
# stopped, so the same command after an interruption goes on; a run archived as finished
# is skipped, even without its run folder. Logs: runs/comparison-GROUP-laneN.log. Each
# finished run is archived into results/runs (spa archive, 200 kB) and its run folder
# (2-4 GB of checkpoints; about 40 of them would not fit on a 64 GB disk) removed, unless
# KEEP_RUNS=1. At the end results/comparison holds spa compare's table.
set -u
cd "$(dirname "$0")/.."
SPA=${SPA:-.venv/bin/spa}
groups=("${@:-frozenlake}")
valid="frozenlake, sokoban, frozenlake-ablations, sokoban-ablations, frozenlake-rows, sokoban-rows, sudoku, frozenlake-transfer"
for group in "${groups[@]}"; do
  case ", $valid, " in
    *", $group, "*) ;;
    *) echo "unknown group '$group'; valid: $valid" >&2; exit 2 ;;
  esac
done
mkdir -p runs results/runs

cell() {  # cell PREFIX METHOD SEED [VARIANT key=value ...]: configs/PREFIX-METHOD-iterate.yaml
  local prefix=$1 method=$2 seed=$3 name="$1-$2-iterate"
  shift 3
  if [ $# -gt 0 ]; then name="$name-$1"; shift; fi
  # Archived and finished: done, even where its run folder is gone (a fresh machine).
  if grep -qs '"report"' "results/runs/$name-s$seed/stages.json"; then return 0; fi
  "$SPA" run "configs/$prefix-$method-iterate.yaml" "seed=$seed" "$@" --name "$name-s$seed" &&
    "$SPA" archive "runs/$name-s$seed" --out results/runs &&
    if [ -z "${KEEP_RUNS:-}" ]; then rm -rf "runs/$name-s$seed"; fi
}

# SPA's rounds in the world-model prompt: answers of ~130 tokens instead of ~20.
WORLD_MODEL=(world_model prompt.mode=world_model iterate.max_new_tokens=200 eval.max_new_tokens=200)

lane() {  # lane GROUP 1|2: that lane's cells, in order (lane 1 holds the longer SPA runs)
  local env=${1%%-*} seed
  case $1:$2 in
    frozenlake:1 | sokoban:1) for seed in 0 1 2; do cell "$env" spa "$seed"; done ;;
    frozenlake:2 | sokoban:2)
      for seed in 0 1; do cell "$env" vanilla "$seed"; done
      cell "$env" state_estimation 0
      cell "$env" vanilla 2
      for seed in 1 2; do cell "$env" state_estimation "$seed"; done ;;
    *-ablations:1)
      cell "$env" spa 0 self_belief selfplay.states=self_belief
      cell "$env" spa 0 random_exploration selfplay.exploration=random ;;
    *-ablations:2)
      cell "$env" spa 0 random_coords selfplay.coords=random
      cell "$env" spa 0 masked_states sft.mask_states=true ;;
    *-rows:1) for seed in 0 1 2; do cell "$env" spa "$seed" "${WORLD_MODEL[@]}"; done ;;
    *-rows:2) for seed in 0 1 2; do cell "$env" rwml "$seed"; done ;;
    *:1) for seed in 0 1 2; do cell "$1" spa "$seed"; done ;;  # sudoku, frozenlake-transfer
    *:2) for seed in 0 1 2; do cell "$1" vanilla "$seed"; done ;;
  esac
}

for group in "${groups[@]}"; do
  for n in 1 2; do
    (export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1; lane "$group" "$n") > "runs/comparison-$group-lane$n.log" 2>&1 &
  done
  wait
done
"$SPA" compare results/runs/* --out results/comparison
