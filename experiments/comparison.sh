#!/usr/bin/env bash
# The comparison of docs/comparison.md: every method from a format bootstrap in its
# own prompt, the same RL stage (expert iteration with the solver's per-turn label, three
# rounds), learn preset, 128 x 8 evaluation, seeds 0-2.
#
#   experiments/comparison.sh [GROUP ...]   # default: frozenlake
#   SEEDS=0 experiments/comparison.sh ...   # only these seeds of each group (default: 0 1 2)
#
# GROUP is one of
#   frozenlake, sokoban     vanilla, state estimation and SPA, seeds 0-2 (the table's core);
#   ENV-ablations           the paper's four SPA ablations on ENV (frozenlake or sokoban), seed 0
#                           (whatever SEEDS says);
#   ENV-rows                SPA playing its rounds in the world-model prompt, VAGEN-style
#                           rewards (rounds that keep grounded states) and RWML, seeds 0-2;
#   ENV-value               vanilla and SPA on ENV with the rounds' label from the task's reward
#                           alone (iterate.keep=value: the first move best by Monte-Carlo
#                           value) instead of the solver's, seeds 0-2;
#   sudoku                  vanilla and SPA on Sudoku 4x4, seeds 0-2;
#   frozenlake-transfer     vanilla and SPA trained on 4x4 lakes, RL and evaluation on 6x6,
#                           seeds 0-2.
# Groups run in the order given; a lane that finds no unclaimed cell left in a group goes
# on to the next group while the other finishes its cell.
#
# Two lanes run side by side, one core each (bench/sharing.py: 1.37x the throughput of one
# run on both cores for evaluation, 1.07x for SFT, Zen 4), each taking the group's next
# cell that the other has not claimed, so neither idles while cells remain. LANES=N runs
# N lanes, each on its share of the cores: LANES=1 gives one run every core, so each run
# finishes in about 0.6x the time (estimated from those ratios), for a machine held for
# less time than a run beside another takes. Every `spa run` resumes where it stopped, so
# the same command after an interruption goes on; a run archived as finished is skipped,
# even without its run folder. Logs: runs/comparison-GROUP-laneN.log. Each
# finished run is archived into results/runs (spa archive, 200 kB) and its run folder
# (2-4 GB of checkpoints; about 40 of them would not fit on a 64 GB disk) removed, unless
# KEEP_RUNS=1. At the end results/comparison holds spa compare's table.
set -u
cd "$(dirname "$0")/.."
SPA=${SPA:-.venv/bin/spa}
LANES=${LANES:-2}
case $LANES in
  '' | *[!0-9]* | 0) echo "LANES='$LANES' is not a number of lanes; valid: 1, 2, ..." >&2; exit 2 ;;
esac
SEEDS=${SEEDS:-0 1 2}
for seed in $SEEDS; do
  case $seed in
    *[!0-9]*) echo "SEEDS='$SEEDS': '$seed' is not a seed; valid: whole numbers 0, 1, 2, ..." >&2; exit 2 ;;
  esac
done
threads=$(( $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) / LANES ))  # nproc alone obeys OMP_NUM_THREADS
if [ "$threads" -lt 1 ]; then threads=1; fi
groups=("${@:-frozenlake}")
valid="frozenlake, sokoban, frozenlake-ablations, sokoban-ablations, frozenlake-rows, sokoban-rows, frozenlake-value,"
valid="$valid sokoban-value, sudoku, frozenlake-transfer"
for group in "${groups[@]}"; do
  case ", $valid, " in
    *", $group, "*) ;;
    *) echo "unknown group '$group'; valid: $valid" >&2; exit 2 ;;
  esac
done
mkdir -p runs results/runs

name_of() {  # name_of PREFIX METHOD SEED [VARIANT ...]: the cell's run name
  local name="$1-$2-iterate"
  if [ $# -gt 3 ]; then name="$name-$4"; fi
  echo "$name-s$3"
}

cell() {  # cell PREFIX METHOD SEED [VARIANT key=value ...]: configs/PREFIX-METHOD-iterate.yaml
  local name recipe="configs/$1-$2-iterate.yaml" seed=$3
  name=$(name_of "$@")
  shift 3
  if [ $# -gt 0 ]; then shift; fi
  # Archived and finished: done, even where its run folder is gone (a fresh machine).
  if grep -qs '"report"' "results/runs/$name/stages.json"; then return 0; fi
  "$SPA" run "$recipe" "seed=$seed" "$@" --name "$name" &&
    "$SPA" archive "runs/$name" --out results/runs &&
    if [ -z "${KEEP_RUNS:-}" ]; then rm -rf "runs/$name"; fi
}

# SPA's rounds in the world-model prompt: answers of ~130 tokens instead of ~20.
WORLD_MODEL="world_model prompt.mode=world_model iterate.max_new_tokens=200 eval.max_new_tokens=200"

cells() {  # cells GROUP: one line per cell, "PREFIX METHOD SEED [VARIANT key=value ...]"
  local env=${1%%-*} seed  # seed 0 of every method first, the longer SPA runs first in a seed
  case $1 in
    frozenlake | sokoban)
      for seed in $SEEDS; do printf '%s\n' "$env spa $seed" "$env vanilla $seed" "$env state_estimation $seed"; done ;;
    *-ablations)
      printf '%s\n' "$env spa 0 self_belief selfplay.states=self_belief" \
        "$env spa 0 random_exploration selfplay.exploration=random" \
        "$env spa 0 random_coords selfplay.coords=random" "$env spa 0 masked_states sft.mask_states=true" ;;
    *-rows) for seed in $SEEDS; do printf '%s\n' "$env spa $seed $WORLD_MODEL" "$env vagen $seed" "$env rwml $seed"; done ;;
    *-value) for seed in $SEEDS; do printf '%s\n' "$env spa $seed value iterate.keep=value" \
      "$env vanilla $seed value iterate.keep=value"; done ;;
    *) for seed in $SEEDS; do printf '%s\n' "$1 spa $seed" "$1 vanilla $seed"; done ;;  # sudoku, the transfer
  esac
}

lane() {  # lane N GROUP ...: the groups' cells in order, each one no other lane claimed first
  local n=$1 group line
  shift
  for group in "$@"; do  # into the next group at once: no lane waits for another at a group's end
    cells "$group" | while read -r line; do
      # shellcheck disable=SC2086  # a cell's words are its arguments
      mkdir "runs/.claimed/$(name_of $line)" 2>/dev/null && cell $line < /dev/null  # stdin: the cell list
    done > "runs/comparison-$group-lane$n.log" 2>&1
  done
}

rm -rf runs/.claimed  # claims of an interrupted earlier invocation
mkdir -p runs/.claimed
for n in $(seq "$LANES"); do
  (export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads; lane "$n" "${groups[@]}") &
done
wait
rm -rf runs/.claimed
"$SPA" compare results/runs/* --out results/comparison
