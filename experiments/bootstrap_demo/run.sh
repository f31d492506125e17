#!/bin/bash
# The bootstrap on an env where the untouched policy scores 0 but sometimes succeeds with a few-shot prompt.
#   bash experiments/bootstrap_demo/run.sh OUT_DIR       (from the repository root; ~20 min on 2 cores)
set -e
OUT=$(realpath -m "$1"); ROOT=$(pwd); mkdir -p "$OUT"
export PYTHONPATH=$ROOT:$ROOT/kernels:$ROOT/docs/tutorial
python3 experiments/bootstrap_demo/make_policy_data.py "$OUT"
cd docs/tutorial
RZ="python3 -m rz_agents.cli"
# 1. the untouched policy: fine-tuned on the prompt-dependent mixture (its warm_start_model; kept if there)
[ -d $OUT/policy/warm_start_model ] || $RZ train train.yaml steps=1 warm_start.episodes=$OUT/prompt_dependent.jsonl --run-dir $OUT/policy --no-progress > $OUT/policy.log 2>&1
# 2. the bootstrap from it: 5 rounds of 512 samples with the few-shot prompt, then its warm_start_model is the result
$RZ train train.yaml steps=1 model.checkpoint=$OUT/policy/warm_start_model "model.tiny_overrides={}" \
  warm_start.episodes=null warm_start.bootstrap.rounds=5 warm_start.bootstrap.tasks_per_round=128 \
  warm_start.bootstrap.samples_per_task=4 warm_start.bootstrap.threshold=1.0 warm_start.bootstrap.epochs=2 \
  warm_start.bootstrap.lr=1e-3 \
  "warm_start.bootstrap.system_prompt=\"$(cat $OUT/few_shot.txt)\"" --run-dir $OUT/boot --no-progress > $OUT/boot.log 2>&1
# 3. held-out eval, without the few-shot prompt: before and after the bootstrap
$RZ eval $OUT/boot/config.yaml --checkpoint $OUT/policy/warm_start_model --out $OUT/eval_before.json --quiet > $OUT/eval_before.txt
$RZ eval $OUT/boot/config.yaml --checkpoint $OUT/boot/warm_start_model --out $OUT/eval_after.json --quiet > $OUT/eval_after.txt
grep "bootstrap round" $OUT/boot.log; grep "mean reward" $OUT/eval_before.txt $OUT/eval_after.txt
