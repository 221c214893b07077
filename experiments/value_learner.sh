#!/usr/bin/env bash
# The value-label learners of docs/making-rl-learn.md (centred per move, "Centred per move,
# with the exact KL"; or with a baseline of the state), from a format bootstrap, on the
# tasks they were tried on:
#
#   experiments/value_learner.sh TASK [extra spa rl options ...]
#
# TASK is one of
#   lake3       random 3x3 lakes that do not slip, 4 turns of 1 move (8 steps);
#   lake3-fixed a fixed 3x3 lake, DESC=SFF/FHG/FFF by default (6 steps, probe 16 x 8);
#   lake4       slippery 4x4 lakes, 5 turns of up to 3 moves (12 steps);
#   sokoban     Sokoban 6x6 rooms with one box, 5 turns of up to 3 moves (12 steps).
#
# Each builds its bootstrap once (`spa run ... --until bootstrap`) into RUNS (default
# runs/), then runs `spa rl` into RUNS/exp-LEARNER-TASK[-SEED]; the same command with
# `--resume` goes on after an interruption (runs are not kept between machines: a run
# must finish where it started). SEED=N changes the training lakes and samples
# (not the probe's lakes). THREADS sets the torch threads (default: all cores).
# LEARNER=state swaps per-move centring for the baseline of the state
# (`value_objective=state`, docs/making-rl-learn.md, "A baseline of the state"); the run
# folder is then RUNS/exp-state-TASK[-SEED]. START=CHECKPOINT starts RL from another
# checkpoint in the plain prompt (an SPA run's bridge) instead of the format bootstrap.
#
# The learner: each played turn's label is 1 if its move is among the best at its state
# by Monte-Carlo value (128 random continuations on copies of the environment; no solver,
# no critic), centred per first move over the step (center_actions), pushed under PPO's
# clipped loss with the exact KL to the start (kl_estimator=full, kl_coef 0.25); 64 levels
# a step, one episode each; 4 epochs of 16-turn minibatches at lr 5e-5 after 10 warm-up
# updates.
set -euo pipefail
cd "$(dirname "$0")/.."
task=${1:?usage: experiments/value_learner.sh lake3|lake3-fixed|lake4|sokoban [spa rl options]}
shift
runs=${RUNS:-runs}
seed=${SEED:-0}
spa=${SPA:-.venv/bin/spa}
[ -n "${THREADS:-}" ] && export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS

learner=(--algorithm grpo --groups 64 --samples 1 --mode base
  --set advantage=value --set mc_rollouts=128 --set mc_center=false --set center_actions=true
  --set kl_coef=0.25 --set kl_estimator=full --set actor_lr=5e-5 --set warmup_steps=10
  --set ppo_epochs=4 --set max_new_tokens=64 --set micro_batch_size=16 --set minibatch_size=16
  --set save_every=1 --set seed="$seed" --set seed_start=$((seed * 100000)))
learner_name=${LEARNER:-centred}
case $learner_name in
  centred) ;;
  state) learner+=(--set value_objective=state --set center_actions=false) ;;
  *) echo "unknown LEARNER '$learner_name': centred or state" >&2; exit 2 ;;
esac

case $task in
  lake3|lake3-fixed)
    recipe=configs/frozenlake-sanity-3x3.yaml boot_name=lake3-boot
    env=(-e frozenlake -o size=3 -o is_slippery=false --max-turns 4 --max-actions 1)
    if [ "$task" = lake3 ]; then
      probe=(--steps 8 --eval-every 2 --eval-levels 32 --eval-samples 4)
    else
      env+=(-o "desc=${DESC:-SFF/FHG/FFF}")
      probe=(--steps 6 --eval-every 2 --eval-levels 16 --eval-samples 8)
    fi ;;
  lake4)
    recipe=configs/frozenlake-vanilla.yaml boot_name=fl4-vanilla-boot
    env=(-e frozenlake --max-turns 5 --max-actions 3)
    probe=(--steps 12 --eval-every 4 --eval-levels 32 --eval-samples 4) ;;
  sokoban)
    recipe=configs/sokoban-vanilla.yaml boot_name=sokoban-vanilla-boot
    env=(-e sokoban --max-turns 5 --max-actions 3)
    probe=(--steps 12 --eval-every 4 --eval-levels 32 --eval-samples 4) ;;
  *) echo "unknown task '$task': lake3, lake3-fixed, lake4 or sokoban" >&2; exit 2 ;;
esac
start=${START:-$runs/$boot_name/bootstrap/epoch-1}
[ -n "${START:-}" ] || $spa run "$recipe" --until bootstrap --name "$boot_name" --runs-dir "$runs"
out=$runs/exp-$learner_name-$task${SEED:+-$seed}
$spa rl "${env[@]}" --model "$start" --out "$out" "${probe[@]}" "${learner[@]}" "$@"
