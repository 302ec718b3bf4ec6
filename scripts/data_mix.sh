#!/usr/bin/env bash
# Which training text buys more acceptance: existing responses labelled by the target, or responses the target
# regenerates itself? Same 640 ShareGPT conversations (4,500-5,139, never used by data/smollm2-label), same warm start
# (the shipped dFlash drafter), same steps; only the responses differ (docs/training.md, "Labelled vs regenerated").
#
#   bash scripts/data_mix.sh data    # regenerate (greedy, bf16) and label both sets, with local feature caches
#   bash scripts/data_mix.sh extend  # more regenerated data: the next 1,000 ShareGPT prompts and 400 stdlib prompts
#   bash scripts/data_mix.sh train   # the two runs side by side, 1 thread each (re-run to resume)
#   bash scripts/data_mix.sh eval    # held-out acceptance of both runs (and the shipped drafter) on both held-out sets
#   bash scripts/data_mix.sh tau     # tau with real speculative decoding (fp32, 6 prompts per set), both runs
#   bash scripts/data_mix.sh train2  # after `extend`: the shipped dFlash and xPress drafters, 500 steps on it
#   bash scripts/data_mix.sh tau2    # their tau and the shipped folders', as `tau`
set -euo pipefail
cd "$(dirname "$0")/.."

FEATURES=${HF_XPRESS_FEATURES_ROOT:-$HOME/.cache/hf_xpress/features}
# "Shipped" here means the third run's folders, which these experiments started from and compared against (drafters/
# holds the fourth run's since the eighth session).
source scripts/folders_at.sh
SHIPPED3=$(folders_at "$THIRD_RUN")
PROMPTS=(--num-prompts 640 --skip-prompts 4500 --seed 0 --dtype bfloat16 --layer-ids 1,14,27)
STEPS=${STEPS:-500}

case "${1:-}" in
  data)
    hf-xpress data --source regen-sharegpt "${PROMPTS[@]}" --max-new-tokens 256 --batch-size 16 \
      --out data/smollm2-regen --feature-cache "$FEATURES/smollm2-regen-L1-14-27"
    hf-xpress data --source sharegpt "${PROMPTS[@]}" --out data/smollm2-text \
      --feature-cache "$FEATURES/smollm2-text-L1-14-27"
    ;;
  extend)
    # Appended to data/smollm2-regen (resumable: re-run the same command); the code prompts are the "Show me the source
    # of the standard library file X" prompts of `--source stdlib`, answered by the target itself.
    hf-xpress data --extend --source regen-sharegpt,regen-stdlib --num-prompts 1000 --skip-prompts 5140 --num-code 400 \
      --seed 0 --dtype bfloat16 --layer-ids 1,14,27 --max-new-tokens 256 --batch-size 16 \
      --out data/smollm2-regen --feature-cache "$FEATURES/smollm2-regen-L1-14-27"
    ;;
  train)
    mkdir -p runs
    for arm in regen text; do
      [[ -d "runs/mix-$arm/final" ]] && continue
      hf-xpress train --data "data/smollm2-$arm" --feature-cache "$FEATURES/smollm2-$arm-L1-14-27" --refiner none \
        --init-drafter "$SHIPPED3/smollm2-135m-dflash-b16" --train-vocab 8192 --anchors-per-seq 16 --batch-size 4 \
        --lr 6e-4 --max-steps "$STEPS" --mixed-precision bf16 --eval-every 100 --save-every 50 --heldout-every 25 \
        --heldout-seqs 24 --eval-anchors 8 --seed 0 --threads 1 --out "runs/mix-$arm" >> "runs/mix-$arm.log" 2>&1 &
    done
    wait
    ;;
  eval)
    for data in regen text label; do
      python scripts/feature_ablation.py --data "data/smollm2-$data" --modes true \
        --drafters "$SHIPPED3/smollm2-135m-dflash-b16" runs/mix-regen/best runs/mix-text/best \
        --out "results/data-mix/heldout-$data.json"
    done
    ;;
  tau)
    for arm in regen text; do
      python -m hf_xpress.training tau --drafter "runs/mix-$arm/best" --reference results/training/greedy-reference.json \
        --sets humaneval,mtbench,math500 --limit 6 --threads 1 --out "results/data-mix/tau-$arm.json" &
    done
    wait
    ;;
  train2)
    # The same settings as `train`, on the extended regenerated set (chat and code), for dFlash and xPress.
    declare -A SHIPPED=([none]=dflash [xpress]=xpress)
    for refiner in none xpress; do
      [[ -d "runs/mix-regen2-$refiner/final" ]] && continue
      hf-xpress train --data data/smollm2-regen --feature-cache "$FEATURES/smollm2-regen-L1-14-27" --refiner "$refiner" \
        --init-drafter "$SHIPPED3/smollm2-135m-${SHIPPED[$refiner]}-b16" --train-vocab 8192 --anchors-per-seq 16 \
        --batch-size 4 --lr 6e-4 --max-steps "$STEPS" --mixed-precision bf16 --eval-every 100 --save-every 50 \
        --heldout-every 25 --heldout-seqs 24 --eval-anchors 8 --seed 0 --threads 1 --out "runs/mix-regen2-$refiner" \
        >> "runs/mix-regen2-$refiner.log" 2>&1 &
    done
    wait
    ;;
  tau2)
    # The continued runs and, as baselines, the shipped folders, each at its own inference settings (the runs inherit
    # the shipped folders'); results already present are kept.
    declare -A DRAFTERS=([regen2-none]=runs/mix-regen2-none/best [regen2-xpress]=runs/mix-regen2-xpress/best
                         [shipped-dflash]=$SHIPPED3/smollm2-135m-dflash-b16 [shipped-xpress]=$SHIPPED3/smollm2-135m-xpress-b16)
    for name in "${!DRAFTERS[@]}"; do
      [[ -f "results/data-mix/tau-$name.json" ]] && continue
      python -m hf_xpress.training tau --drafter "${DRAFTERS[$name]}" \
        --reference results/training/greedy-reference.json --sets humaneval,mtbench,math500 --limit 6 --threads 1 \
        --out "results/data-mix/tau-$name.json" &
    done
    wait
    ;;
  *)
    sed -n 2,12p "$0"
    exit 2
    ;;
esac
