#!/bin/bash
# The zero-variance skip on the demo: RL from the demo's warm start, 3 seeds x {skip, base}, then the summary.
#   bash experiments/skip_uniform/run.sh OUT_DIR      (from the repository root; ~1 h on 2 loaded cores)
# Step 1 runs the demo once (its warm start, exported as warm_start_model); every arm then starts RL from it.
set -e
OUT=$(realpath -m "$1"); mkdir -p "$OUT"; export PYTHONPATH=$PWD:$PWD/kernels
RZ="nice -n 10 python3 -m rz_agents.cli train demo report=false --no-progress"
[ -d "$OUT/demo-skip-s0/warm_start_model" ] || $RZ rollout.skip_uniform_groups=true --run-dir "$OUT/demo-skip-s0" > "$OUT/demo-skip-s0.log" 2>&1
for arm in base skip; do
  flag=false; [ $arm = skip ] && flag=true
  ( for seed in 0 1 2; do
      $RZ seed=$seed rollout.skip_uniform_groups=$flag model.checkpoint="$OUT/demo-skip-s0/warm_start_model" \
        "model.tiny_overrides={}" warm_start.demos=0 export_final_model=false \
        --run-dir "$OUT/rl-$arm-s$seed" > "$OUT/rl-$arm-s$seed.log" 2>&1
    done ) &
done
wait
python3 experiments/skip_uniform/summarize.py "$OUT"
