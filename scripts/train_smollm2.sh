#!/usr/bin/env bash
# Reproduces the shipped SmolLM2-135M-Instruct drafters (drafters/smollm2-135m-{dflash,markov,xpress}-b16).
# Every step resumes where it stopped: re-run the same command after an interruption.
#
#   bash scripts/train_smollm2.sh data      # label the training set (+ local feature cache)
#   bash scripts/train_smollm2.sh train     # the three runs, in parallel, 1 thread each
#   bash scripts/train_smollm2.sh ship      # measure tau, copy the best checkpoints to drafters/, write the cards
#   bash scripts/train_smollm2.sh lora      # part 5: LoRA-attach xPress to the dFlash drafter
#   bash scripts/train_smollm2.sh continue  # second run: all data labelled, each drafter continues from its first run
#   bash scripts/train_smollm2.sh ship2     # measure and ship the second run's drafters
#   bash scripts/train_smollm2.sh extend    # third run's data: more ShareGPT + stdlib appended, labelled in bf16
#   bash scripts/train_smollm2.sh continue3 # third run: each shipped drafter continues on the extended data
#   bash scripts/train_smollm2.sh ship3     # measure and ship the third run's drafters
#   bash scripts/train_smollm2.sh sweep     # before the fourth run: slot-weight gamma x lr, 300 steps of dFlash
#   bash scripts/train_smollm2.sh mix       # fourth run's data: the regenerated set + 800 labelled stdlib chunks
#   bash scripts/train_smollm2.sh continue4 # fourth run: each shipped drafter continues on it, the same budget for all
#   bash scripts/train_smollm2.sh tau4      # the fourth run's tau (and the shipped Markov drafter's) at shipped settings
#   bash scripts/train_smollm2.sh ship4     # ship the fourth run's drafters
#   bash scripts/train_smollm2.sh functions # fifth run's data: HumanEval-shaped stdlib function tasks (resumable)
#   bash scripts/train_smollm2.sh mix5      # fifth run's data: the fourth run's mix + the function tasks (relabelled)
#   bash scripts/train_smollm2.sh continue5 # fifth run: each shipped (fourth-run) drafter continues on it
#   bash scripts/train_smollm2.sh tau5      # the fifth run's tau on 24 prompts per set, at the shipped settings
#   bash scripts/train_smollm2.sh ship5     # ship the fifth run's drafters
#   bash scripts/train_smollm2.sh maths     # sixth run's data: synthetic MATH-style problems answered by the target
#   bash scripts/train_smollm2.sh mix6      # sixth run's data: mix5 + the maths answers (relabelled)
#   bash scripts/train_smollm2.sh continue6 # sixth run: each shipped (fifth-run) drafter continues on it
#   bash scripts/train_smollm2.sh tau6      # the sixth run's tau on 24 prompts per set, at the shipped settings
#   bash scripts/train_smollm2.sh ship6     # ship the sixth run's drafters
#   bash scripts/train_smollm2.sh maths2    # seventh run's data: 1,600 more maths problems (after the sixth run's 1,200)
#   bash scripts/train_smollm2.sh chat      # seventh run's data: chat requests in MT-Bench's categories, target-answered
#   bash scripts/train_smollm2.sh mix7      # seventh run's data: mix6 + both (relabelled)
#   bash scripts/train_smollm2.sh continue7 # seventh run: each shipped (sixth-run) drafter continues on it
#   bash scripts/train_smollm2.sh tau7      # the seventh run's tau on 24 prompts per set, at the shipped settings
#   bash scripts/train_smollm2.sh ship7     # ship the seventh run's drafters
#   bash scripts/train_smollm2.sh tau7-block # the seventh run's tau with every draft of the block verified
#   bash scripts/train_smollm2.sh continue8 # eighth run: the seventh run's folders continue longer on the same data
#   bash scripts/train_smollm2.sh tau8      # the eighth run's tau on 24 prompts per set, at the shipped settings
#   bash scripts/train_smollm2.sh ship8     # ship the eighth run's drafters
#   bash scripts/train_smollm2.sh grow-probe # capacity probe: the eighth run's dFlash drafter at 2 and at 4 layers
#   bash scripts/train_smollm2.sh continue9 # ninth run: the eighth run's folders continue as the eighth run did
#   bash scripts/train_smollm2.sh tau9      # the ninth run's tau on 24 prompts per set, at the shipped settings
#   bash scripts/train_smollm2.sh ship9     # ship the ninth run's drafters
#   bash scripts/train_smollm2.sh slots-ab  # the ninth run's xPress drafter, all 15 slots against slots 1..4, equal time
#   bash scripts/train_smollm2.sh tau-slots-ab # both arms' tau on 24 prompts per set, at the shipped settings
#   bash scripts/train_smollm2.sh continue10 # tenth run: the ninth run's folders continue on slots 1..4 (--loss-slots 4)
#   bash scripts/train_smollm2.sh tau10     # the tenth run's tau on 24 prompts per set, at the shipped settings
#   bash scripts/train_smollm2.sh ship10    # ship the tenth run's drafters
#   bash scripts/train_smollm2.sh slots2-ab # the tenth run's xPress drafter: its recipe against slots 1..2 x 8 sequences
#   bash scripts/train_smollm2.sh tau-slots2-ab # both arms' tau on 24 prompts per set, at the shipped settings
#   bash scripts/train_smollm2.sh continue11 # eleventh run: the tenth run's folders continue as slots2-ab's 2x8 arm
#   bash scripts/train_smollm2.sh tau11     # the eleventh run's tau on 24 prompts per set, at the shipped settings
#   bash scripts/train_smollm2.sh ship11    # ship the eleventh run's drafters
#   bash scripts/train_smollm2.sh tau-tree  # the shipped drafters with tree verification (TREE=3 branches), LIMIT (24) prompts/set
#   bash scripts/train_smollm2.sh tau-dyn   # the shipped drafters with dynamic trees (TREE=3, BUDGET=8 nodes, DEPTH=4), LIMIT (24) prompts/set; LOOKUP=N adds prompt lookup as a branch
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=smollm2-135m-instruct
DATA=data/smollm2-label
CACHE=${HF_XPRESS_FEATURES:-$HOME/.cache/hf_xpress/features/smollm2-label-L1-14-27}
LAYER_IDS=1,14,27
MIX_CACHE=${HF_XPRESS_MIX_FEATURES:-$HOME/.cache/hf_xpress/features/smollm2-mix-L1-14-27}
REGEN_CACHE=${HF_XPRESS_REGEN_FEATURES:-$HOME/.cache/hf_xpress/features/smollm2-regen-L1-14-27}
MIX5_CACHE=${HF_XPRESS_MIX5_FEATURES:-$HOME/.cache/hf_xpress/features/smollm2-mix5-L1-14-27}
MIX6_CACHE=${HF_XPRESS_MIX6_FEATURES:-$HOME/.cache/hf_xpress/features/smollm2-mix6-L1-14-27}
MIX7_CACHE=${HF_XPRESS_MIX7_FEATURES:-$HOME/.cache/hf_xpress/features/smollm2-mix7-L1-14-27}

# Same drafter, data and budget for the three runs; only --refiner differs.
COMMON=(--target "$TARGET" --data "$DATA" --feature-cache "$CACHE"
        --layers 2 --layer-ids "$LAYER_IDS" --block-size 16 --mask-token-id 16 --refiner-rank 128
        --train-vocab 8192 --anchors-per-seq 16 --batch-size 4 --grad-accum 1 --lr 1e-3 --max-steps 900 --mixed-precision bf16
        --eval-every 100 --save-every 25 --heldout-every 25 --heldout-seqs 24 --eval-anchors 8 --seed 0 --threads 1)

REF=results/training/greedy-reference.json
REF24=results/training/greedy-reference-24.json

# The third run's shipped folders, where the sweep and the fourth run start (drafters/ now holds the fourth run's).
source scripts/folders_at.sh
SHIPPED3=$(folders_at "$THIRD_RUN")
# Each run's refiner and the folder it ships to: runs/smollm2-REFINER* -> drafters/smollm2-135m-FOLDER-b16.
declare -A FOLDER=([none]=dflash [markov]=markov [xpress]=xpress)

# measure SUFFIX [LIMIT REFERENCE CHECKPOINT TAG TAU-ARGS...]: tau of runs/smollm2-{none,markov,xpress}SUFFIX/CHECKPOINT
# (default best), in parallel, on the first LIMIT prompts of each set (default 6), into
# results/training/tau-REFINERSUFFIXTAG.json; TAU-ARGS (e.g. --set KEY=VALUE) go to each `tau` command. REFINERS (e.g.
# REFINERS=none) measures only those runs: one can start as soon as its run has finished.
measure() {
  local suffix=$1 limit=${2:-6} ref=${3:-$REF} checkpoint=${4:-best} tag=${5:-} refiner
  local extra=("${@:6}")
  for refiner in ${REFINERS:-none markov xpress}; do
    python -m hf_xpress.training tau --drafter "runs/smollm2-$refiner$suffix/$checkpoint" --reference "$ref" \
      --sets humaneval,mtbench,math500 --limit "$limit" --threads 1 ${extra[@]+"${extra[@]}"} \
      --out "results/training/tau-$refiner$suffix$tag.json" &
  done
  wait
}

# ship SUFFIX [CHECKPOINT]: the runs' folders (best or final checkpoint, default best) in drafters/, with model cards
# comparing the three (measured by `measure SUFFIX`).
ship() {
  local suffix=$1 checkpoint=${2:-best} refiner
  local taus=(--tau "dFlash=results/training/tau-none$suffix.json" --tau "+ Markov=results/training/tau-markov$suffix.json"
              --tau "+ xPress=results/training/tau-xpress$suffix.json")
  # From the third run on, the folders carry the inference settings measured best on this CPU
  # (results/smollm2-bf16-drafts: 2 drafts per round; shortlist 64; xPress K = 2 with early stop, threshold 0.2).
  local none=() markov=() xpress=()  # per refiner
  if [[ $suffix != "" && $suffix != "-2" ]]; then
    none=(--set num_assistant_tokens=2)
    markov=(--set num_assistant_tokens=2 --set refiner_shortlist=64)
    xpress=(--set num_assistant_tokens=2 --set refiner_shortlist=64 --set jacobi_passes=2
            --set assistant_confidence_threshold=0.2)
  fi
  for refiner in none markov xpress; do
    local -n settings=$refiner
    python -m hf_xpress.training ship --run "runs/smollm2-$refiner$suffix" --checkpoint "$checkpoint" \
      --out "drafters/smollm2-135m-${FOLDER[$refiner]}-b16" "${taus[@]}" ${settings[@]+"${settings[@]}"}
    unset -n settings
  done
  for d in drafters/*/; do cp hf_xpress/configuration_xpress.py hf_xpress/modeling_xpress.py "$d"; done
}

# continue_shipped SUFFIX DATA CACHE SHIPPED_DIR [TRAIN-ARGS...]: each of SHIPPED_DIR's three folders continues for
# CONTINUE_STEPS steps (default 1,200; lr 6e-4, new cosine schedule) on DATA into runs/smollm2-{none,markov,xpress}SUFFIX,
# the same budget for all three, side by side; TRAIN-ARGS come last, so they override these settings. Held-out: 48
# sequences x 24 anchors (1,152 blocks: slot-1 accuracy +-0.013; 192 blocks gave +-0.03). Run again to resume: finished
# runs are skipped, the others continue from their checkpoint.
continue_shipped() {
  local suffix=$1 data=$2 cache=$3 shipped=$4 refiner
  shift 4
  for refiner in ${REFINERS:-none markov xpress}; do
    [[ -d "runs/smollm2-$refiner$suffix/final" ]] && continue
    hf-xpress train "${COMMON[@]}" --data "$data" --feature-cache "$cache" --refiner "$refiner" \
      --init-drafter "$shipped/smollm2-135m-${FOLDER[$refiner]}-b16" --lr 6e-4 --max-steps "${CONTINUE_STEPS:-1200}" \
      --eval-every 200 --heldout-seqs 48 --eval-anchors 24 ${MAX_SECONDS:+--max-seconds $MAX_SECONDS} "$@" \
      --out "runs/smollm2-$refiner$suffix" >> "runs/smollm2-$refiner$suffix.log" 2>&1 &
  done
  wait
}

# tau_dev_arms ARM...: real tau of runs/smollm2-ARM/final on the development split (prompts 25-40 of each set), 6-node
# dynamic trees 4 deep, at each tree_temperature in TEMPS (default "1.0 1.5"), the arms side by side, 1 thread each ->
# results/training/tau-ARM-dev-dyn3b6d4t<T>.json.
tau_dev_arms() {
  local t arm
  for t in ${TEMPS:-1.0 1.5}; do
    for arm in "$@"; do
      python -m hf_xpress.training tau --drafter "runs/smollm2-$arm/final" \
        --reference results/training/greedy-reference-dev16.json \
        --sets humaneval,mtbench,math500 --skip 24 --limit 16 --threads 1 --tree 3 --tree-budget 6 \
        --set num_assistant_tokens=4 --set "tree_temperature=$t" \
        --out "results/training/tau-$arm-dev-dyn3b6d4t$t.json" &
    done
    wait
  done
}

# extend_mix FROM TO SEED CACHE DATASET...: TO = FROM (its committed labels kept) + every sequence of each DATASET,
# relabelled by the bf16 forward that also fills the feature cache CACHE (for the whole of TO). Resumable.
extend_mix() {
  local from=$1 to=$2 seed=$3 cache=$4 sources
  shift 4
  sources=$(printf 'dataset:%s,' "$@")
  if [[ ! -f "$to/manifest.json" ]]; then
    mkdir -p "$to"
    cp "$from"/*.npy "$from/manifest.json" "$to/"
  fi
  hf-xpress data --target "$TARGET" --extend --source "${sources%,}" --seed "$seed" --dtype bfloat16 \
    --out "$to" --layer-ids "$LAYER_IDS" --feature-cache "$cache" --threads 2
}

case "${1:-all}" in
  data|all)
    # ShareGPT first exchanges (their existing responses) + stdlib source as code blocks, shuffled (seed 0),
    # labelled by one teacher-forced target forward; the labelled prefix is used if stopped early.
    hf-xpress data --target "$TARGET" --source sharegpt,stdlib --num-prompts 1500 --num-code 700 --seed 0 \
      --out "$DATA" --layer-ids "$LAYER_IDS" --feature-cache "$CACHE" --threads 2 ${MAX_SECONDS:+--max-seconds $MAX_SECONDS}
    ;;&
  train|all)
    mkdir -p runs
    for refiner in none markov xpress; do
      hf-xpress train "${COMMON[@]}" --refiner "$refiner" --out "runs/smollm2-$refiner" > "runs/smollm2-$refiner.log" 2>&1 &
    done
    wait
    ;;&
  ship|all)
    # tau with real speculative decoding (greedy, fp32 target): plain greedy outputs once, then each drafter.
    python -m hf_xpress.training tau --reference "$REF" --sets humaneval,mtbench,math500 --limit 6 --threads 1
    measure ""
    ship ""
    ;;
  continue)
    # Second run: the whole data set labelled (1,836 sequences); each drafter starts from its first run's final
    # weights and gets the same extra budget: CONTINUE_STEPS steps on a new cosine schedule (lr 6e-4), stopped and
    # checkpointed at MAX_SECONDS if given (re-run to resume).
    mkdir -p runs
    for refiner in none markov xpress; do
      hf-xpress train "${COMMON[@]}" --refiner "$refiner" --init-drafter "runs/smollm2-$refiner/final" --lr 6e-4 \
        --max-steps "${CONTINUE_STEPS:-1000}" ${MAX_SECONDS:+--max-seconds $MAX_SECONDS} \
        --out "runs/smollm2-$refiner-2" > "runs/smollm2-$refiner-2.log" 2>&1 &
    done
    wait
    ;;
  ship2)
    measure -2
    ship -2
    ;;
  extend)
    # Third run's data: more ShareGPT conversations (the next 3,000) and stdlib chunks (up to 1,500; the first 700
    # are present already and skipped), appended to the committed set and labelled by a bf16 target forward (~3x
    # faster on this CPU than fp32). The same pass rebuilds the local feature cache of the existing sequences,
    # whose committed fp32 labels are kept.
    hf-xpress data --target "$TARGET" --extend --source sharegpt,stdlib --skip-prompts 1500 --num-prompts 3000 \
      --num-code 1500 --seed 1 --dtype bfloat16 --out "$DATA" --layer-ids "$LAYER_IDS" --feature-cache "$CACHE" \
      --threads 2 ${MAX_SECONDS:+--max-seconds $MAX_SECONDS}
    ;;
  continue3)
    # Third run: each shipped drafter (second run) continues on the extended data, the same budget for all three.
    mkdir -p runs
    # Run again to resume: finished runs are skipped, the others continue from their checkpoint (logs appended).
    for refiner in ${REFINERS:-none markov xpress}; do
      [[ -d "runs/smollm2-$refiner-3/final" ]] && continue
      hf-xpress train "${COMMON[@]}" --refiner "$refiner" --init-drafter "drafters/smollm2-135m-${FOLDER[$refiner]}-b16" \
        --lr 6e-4 --max-steps "${CONTINUE_STEPS:-1000}" ${MAX_SECONDS:+--max-seconds $MAX_SECONDS} \
        --out "runs/smollm2-$refiner-3" >> "runs/smollm2-$refiner-3.log" 2>&1 &
    done
    wait
    ;;
  ship3)
    measure -3
    ship -3
    ;;
  sweep)
    # Before the fourth run: the slot-weight decay gamma (2: weight on the first drafts only; 7: dFlash's) x the
    # learning rate, 300 steps of the third run's dFlash drafter on data/smollm2-regen (its feature cache is built by
    # the first command below; a no-op once built), two runs at a time. Held-out: 24 sequences x 48 anchors (1,152
    # blocks); the held-out losses are slot-weighted, so they differ by gamma. -> results/training/sweep-gamma-lr.json
    hf-xpress data --target "$TARGET" --out data/smollm2-regen --dtype bfloat16 --layer-ids "$LAYER_IDS" \
      --feature-cache "$REGEN_CACHE" --threads 2
    for lrs in "6e-4" "2e-3"; do
      for gamma in 2 7; do
        [[ -d "runs/sweep-g$gamma-lr$lrs/final" ]] && continue
        hf-xpress train "${COMMON[@]}" --data data/smollm2-regen \
          --feature-cache "$REGEN_CACHE" \
          --refiner none --init-drafter "$SHIPPED3/smollm2-135m-dflash-b16" --gamma "$gamma" --lr "$lrs" \
          --max-steps 300 --eval-anchors 48 --out "runs/sweep-g$gamma-lr$lrs" >> "runs/sweep-g$gamma-lr$lrs.log" 2>&1 &
      done
      wait
    done
    python - <<'PY'
import json
from pathlib import Path
curves = {}
for run in sorted(Path("runs").glob("sweep-g*-lr*")):
    if run.is_dir():
        history = json.loads((run / "final" / "training_history.json").read_text())["history"]
        curves[run.name.removeprefix("sweep-")] = [
            {"step": e["step"], "tokens": e["tokens"], "heldout_loss": e["heldout_loss"], "tau_est": e["tau_est"],
             "tau_block": e["tau_block"], "acc1": e["slot_acc"][0], "acc1_se": e["acc1_se"], "blocks": e["blocks"]}
            for e in history]
Path("results/training/sweep-gamma-lr.json").write_text(json.dumps(curves, indent=1))
PY
    ;;
  mix)
    # Fourth run's data: the regenerated set (the target's own answers to ShareGPT and stdlib-code prompts,
    # data/smollm2-regen, built by scripts/data_mix.sh) plus 800 stdlib chunks with their real source labelled:
    # training on regenerated text alone lowered HumanEval tau (results/data-mix). The committed labels are kept; on a
    # fresh machine the same pass rebuilds the feature cache of every sequence.
    if [[ ! -f data/smollm2-mix/manifest.json ]]; then
      mkdir -p data/smollm2-mix
      cp data/smollm2-regen/*.npy data/smollm2-regen/manifest.json data/smollm2-mix/
    fi
    hf-xpress data --target "$TARGET" --extend --source stdlib --num-code 800 --seed 2 --dtype bfloat16 \
      --out data/smollm2-mix --layer-ids "$LAYER_IDS" --feature-cache "$MIX_CACHE" --threads 2
    ;;
  continue4)
    # Fourth run: each shipped drafter (third run) continues on the mix.
    continue_shipped -4 data/smollm2-mix "$MIX_CACHE" "$SHIPPED3"
    ;;
  tau4)
    # The fourth run's drafters on 24 prompts per set (their first 6 compare with the shipped drafters, measured at
    # the same settings on 6: the dFlash and xPress ones by scripts/data_mix.sh tau2, results/data-mix/), and the
    # shipped Markov drafter. Plain greedy outputs of the 24 prompts computed once first.
    python -m hf_xpress.training tau --reference "$REF24" --sets humaneval,mtbench,math500 --limit 24 --threads 1
    measure -4 24 "$REF24" &
    [[ -f results/training/tau-shipped-markov.json ]] || python -m hf_xpress.training tau \
      --drafter "$SHIPPED3/smollm2-135m-markov-b16" --reference "$REF" --sets humaneval,mtbench,math500 --limit 6 \
      --threads 1 --out results/training/tau-shipped-markov.json
    wait
    ;;
  ship4)
    ship -4
    ;;
  functions)
    # Data for the next run: the fourth run gained least on HumanEval-like requests. The standard library's documented
    # functions as "complete this function" tasks, answered by the target (greedy, bf16) and by their real source
    # (labelled). Resumable: regeneration keeps finished batches, labelling its prefix (MAX_SECONDS stops it).
    hf-xpress data --target "$TARGET" --source regen-pyfunc,pyfunc --num-functions 1121 --seed 3 --dtype bfloat16 \
      --max-new-tokens 256 --batch-size 16 --out data/smollm2-pyfunc --threads 2 ${MAX_SECONDS:+--max-seconds $MAX_SECONDS}
    ;;
  mix5)
    # Fifth run's data: the fourth run's mix (its committed labels kept) + every sequence of data/smollm2-pyfunc
    # (relabelled by the same bf16 forward that fills the feature cache). The held-out split (every 25th sequence, the
    # first 48 used) lies inside the mix's prefix, so held-out figures compare with the fourth run's.
    extend_mix data/smollm2-mix data/smollm2-mix5 4 "$MIX5_CACHE" data/smollm2-pyfunc
    ;;
  continue5)
    # Fifth run: each shipped drafter (fourth run) continues on mix5.
    continue_shipped -5 data/smollm2-mix5 "$MIX5_CACHE" "$(folders_at "$FOURTH_RUN")"
    ;;
  tau5)
    # As tau4: 24 prompts per set, greedy fp32, the drafters' shipped settings (the reference is committed), but of the
    # runs' final weights: the held-out set (every 25th sequence, the first 48) lies in the fourth run's mix, so it
    # cannot see what the function tasks teach, and "best" by it could be step 0, the fourth run's weights.
    measure -5 24 "$REF24" final
    ;;
  ship5)
    ship -5 final
    ;;
  maths)
    # Sixth run's data: the fifth run gained least on MATH-500, and no maths training set installs offline (MMATH is
    # the benchmark). Synthetic MATH-style problems (hf_xpress.training.maths_problems, asked as the benchmark asks),
    # answered by the target (greedy, bf16). Resumable: regeneration keeps finished batches.
    hf-xpress data --target "$TARGET" --source regen-maths --num-maths "${NUM_MATHS:-1200}" --seed 5 --dtype bfloat16 \
      --max-new-tokens 256 --batch-size 16 --out data/smollm2-maths --threads 2
    ;;
  mix6)
    # Sixth run's data: mix5 (its labels kept) + every sequence of data/smollm2-maths (relabelled by the bf16 forward
    # that also fills the feature cache). Held-out split as before (inside the fourth run's mix).
    extend_mix data/smollm2-mix5 data/smollm2-mix6 6 "$MIX6_CACHE" data/smollm2-maths
    ;;
  continue6)
    # Sixth run: each shipped drafter (fifth run) continues on mix6.
    continue_shipped -6 data/smollm2-mix6 "$MIX6_CACHE" "$(folders_at "$FIFTH_RUN")"
    ;;
  tau6)
    measure -6 24 "$REF24" final
    ;;
  ship6)
    ship -6 final
    ;;
  maths2)
    # Seventh run's data: the maths problems lifted MATH-500 most (sixth run); 1,600 more of the same families and
    # seed, after the 1,200 of data/smollm2-maths (so none repeats one of them).
    hf-xpress data --target "$TARGET" --source regen-maths --num-maths 1600 --skip-prompts 1200 --seed 5 \
      --dtype bfloat16 --max-new-tokens 256 --batch-size 16 --out data/smollm2-maths2 --threads 2
    ;;
  chat)
    # Seventh run's data: MT-Bench moved least in every run. Chat requests in its eight categories
    # (hf_xpress.training.chat_tasks, drawn from our own word lists, never a benchmark question), answered by the target.
    hf-xpress data --target "$TARGET" --source regen-chat --num-chat "${NUM_CHAT:-1200}" --seed 7 --dtype bfloat16 \
      --max-new-tokens 256 --batch-size 16 --out data/smollm2-chat --threads 2
    ;;
  mix7)
    extend_mix data/smollm2-mix6 data/smollm2-mix7 7 "$MIX7_CACHE" data/smollm2-maths2 data/smollm2-chat
    ;;
  continue7)
    # Seventh run: each shipped drafter (sixth run) continues on mix7.
    continue_shipped -7 data/smollm2-mix7 "$MIX7_CACHE" "$(folders_at "$SIXTH_RUN")"
    ;;
  tau7)
    measure -7 24 "$REF24" final
    ;;
  ship7)
    ship -7 final
    ;;
  tau7-block)
    # As tau7, but every draft of the block submitted (15 per round, no confidence threshold), as the papers measure
    # tau: the shipped 2 drafts per round are what pays on this CPU, but they cap tau at 3 and hide how far the
    # refiners carry a block.
    measure -7 "${LIMIT:-24}" "$REF24" final -block --set num_assistant_tokens=15 --set assistant_confidence_threshold=0
    ;;
  continue8)
    # Eighth run: no new data; each shipped drafter (seventh run) continues on mix7 for CONTINUE_STEPS steps (2,400 here,
    # twice the earlier runs' budget). The feature ablation found the drafters under-trained (slot 1 no better than a
    # trigram table), and every run so far ended with the held-out estimate still rising: this run measures what
    # more steps on the same tokens buy. On a new machine `bash scripts/train_smollm2.sh mix7` first (it rebuilds the
    # feature cache; the labels are committed).
    CONTINUE_STEPS=${CONTINUE_STEPS:-2400} continue_shipped -8 data/smollm2-mix7 "$MIX7_CACHE" "$(folders_at "$SEVENTH_RUN")"
    ;;
  tau8)
    measure -8 24 "$REF24" final
    ;;
  ship8)
    ship -8 final
    ;;
  continue9)
    # Ninth run: the eighth run's recipe once more (2,400 steps at lr 6e-4 on mix7, from the eighth run's folders). The
    # fit gap (scripts/feature_ablation.py --train-neighbours) found the eighth-run drafters scoring the same on
    # training sequences as on held-out ones: not data-bound yet. The trainer's step is faster since (fused CE + TV
    # loss, glibc keeping freed blocks), so the same budget costs less time.
    CONTINUE_STEPS=${CONTINUE_STEPS:-2400} continue_shipped -9 data/smollm2-mix7 "$MIX7_CACHE" "$(folders_at "$EIGHTH_RUN")"
    ;;
  tau9)
    measure -9 24 "$REF24" final
    ;;
  ship9)
    ship -9 final
    ;;
  slots-ab)
    # Before a tenth run: does training slots 1..4 only (--loss-slots 4) buy more per hour of CPU? The fit gap found
    # the drafters short of training examples, not of data; the shipped settings verify 2 drafts per round, and the
    # trainer's step is dominated by the scores of 15 slots x the training vocabulary. Both arms start from the ninth
    # run's xPress folder on mix7, side by side, 1 thread each, lr 3e-4 (a lower re-warm than 6e-4's dip), for about
    # the same time: scripts/train_speed.py measured --loss-slots 4 at 1.67x the steps per second of all 15 slots
    # (0.719 against 1.204 s/step, 63 blocks per step, side by side), so 2,100 against 3,500 steps; seven held-out
    # estimates each, at the same fractions of the run (every 300 and every 500 steps).
    ninth=$(folders_at "$NINTH_RUN")
    for arm in "15 2100 300" "4 3500 500"; do
      set -- $arm
      REFINERS=xpress CONTINUE_STEPS=$2 continue_shipped "-slots$1" data/smollm2-mix7 "$MIX7_CACHE" "$ninth" \
        --loss-slots "$1" --lr 3e-4 --eval-every "$3" &
    done
    wait
    ;;
  tau-slots-ab)
    REFINERS=xpress measure -slots15 24 "$REF24" final &
    REFINERS=xpress measure -slots4 24 "$REF24" final &
    wait
    ;;
  continue10)
    # Tenth run: what slots-ab measured, for all three: each ninth-run folder continues 3,500 steps on mix7 at lr 3e-4
    # with --loss-slots 4. The xPress run is that experiment's arm (runs/smollm2-xpress-slots4: the same command), so it
    # is linked when present rather than trained again.
    ninth=$(folders_at "$NINTH_RUN")
    [[ -d runs/smollm2-xpress-slots4/final && ! -e runs/smollm2-xpress-10 ]] && ln -s smollm2-xpress-slots4 runs/smollm2-xpress-10
    CONTINUE_STEPS=3500 continue_shipped -10 data/smollm2-mix7 "$MIX7_CACHE" "$ninth" --loss-slots 4 --lr 3e-4 --eval-every 500
    ;;
  tau10)
    # Where xPress's tenth run is the linked slots-ab arm, it is already measured (tau-xpress-slots4.json): dFlash and
    # the Markov head only then, unless REFINERS says otherwise; a tenth xPress run trained here is measured too.
    default="none markov xpress"
    [[ -L runs/smollm2-xpress-10 ]] && default="none markov"
    REFINERS=${REFINERS:-$default} measure -10 24 "$REF24" final
    ;;
  ship10)
    ship -10 final
    ;;
  slots2-ab)
    # Before an eleventh run: slots 1..2 (what the shipped settings verify) with 8 sequences per step against the tenth
    # run's recipe (slots 1..4, 4 sequences), both from the tenth run's xPress folder on mix7, side by side, 1 thread
    # each, lr 3e-4, for about the same time: scripts/train_speed.py measured 0.99 s against 0.67 s per step (128 and
    # 63 blocks per step; 128 against 94 slot-1 examples per second), so 1,360 against 2,000 steps; five held-out
    # estimates each, at the same fractions of the run.
    tenth=$(folders_at "$TENTH_RUN")
    for arm in "4 4 2000 400" "2 8 1360 272"; do
      set -- $arm
      REFINERS=xpress CONTINUE_STEPS=$3 continue_shipped "-ab-s$1b$2" data/smollm2-mix7 "$MIX7_CACHE" "$tenth" \
        --loss-slots "$1" --batch-size "$2" --lr 3e-4 --eval-every "$4" &
    done
    wait
    ;;
  tau-slots2-ab)
    REFINERS=xpress measure -ab-s4b4 24 "$REF24" final &
    REFINERS=xpress measure -ab-s2b8 24 "$REF24" final &
    wait
    ;;
  continue11)
    # Eleventh run: slots2-ab's 2x8 arm for all three: each tenth-run folder continues 1,360 steps on mix7 at lr 3e-4
    # with --loss-slots 2 --batch-size 8. The xPress run is that arm (the same command), linked when present.
    tenth=$(folders_at "$TENTH_RUN")
    [[ -d runs/smollm2-xpress-ab-s2b8/final && ! -e runs/smollm2-xpress-11 ]] && ln -s smollm2-xpress-ab-s2b8 runs/smollm2-xpress-11
    CONTINUE_STEPS=1360 continue_shipped -11 data/smollm2-mix7 "$MIX7_CACHE" "$tenth" --loss-slots 2 --batch-size 8 \
      --lr 3e-4 --eval-every 272
    ;;
  tau11)
    # A linked xPress run is slots2-ab's arm, measured by tau-slots2-ab (tau-xpress-ab-s2b8.json): dFlash and Markov
    # only then, unless REFINERS says otherwise.
    default="none markov xpress"
    [[ -L runs/smollm2-xpress-11 ]] && default="none markov"
    REFINERS=${REFINERS:-$default} measure -11 24 "$REF24" final
    ;;
  ship11)
    [[ -L runs/smollm2-xpress-11 && ! -e results/training/tau-xpress-11.json ]] &&
      cp results/training/tau-xpress-ab-s2b8.json results/training/tau-xpress-11.json
    ship -11 final
    ;;
  tau-tree)
    # The shipped drafters, greedy with tree verification (hf_xpress.tree_decoding) of TREE (default 3) slot-1
    # branches, at their shipped drafts per round, on the prompts and greedy reference of tau11.
    for refiner in ${REFINERS:-none markov xpress}; do
      name=${refiner/none/dflash}
      python -m hf_xpress.training tau --drafter "drafters/smollm2-135m-$name-b16" --reference "$REF24" \
        --sets humaneval,mtbench,math500 --limit "${LIMIT:-24}" --threads 1 --tree "${TREE:-3}" \
        --out "results/training/tau-$refiner-11-tree${TREE:-3}.json" &
    done
    wait
    ;;
  tau-dyn)
    # Nineteenth session: the shipped drafters with dynamic trees (tree_budget: the drafter's BUDGET (8) most probable
    # draft nodes, TREE (3) children from each of the TREE best nodes per slot, up to DEPTH (4) slots deep), greedy,
    # on the prompts and greedy reference of tau11.
    # LOOKUP=N (twentieth session): prompt lookup's N drafts join each tree as a branch (tag ...l<N>).
    # TEMP=T (twenty-first session): the tree ranks its nodes with the drafter's scores divided by T (tree_temperature;
    # tag ...t<T>). DEV=1: on the development split instead (each set's prompts 25-40, never reported; tag dev-...).
    # TAG=S appends S to the tag (a measurement of changed code, next to the earlier files).
    tag="dyn${TREE:-3}b${BUDGET:-8}d${DEPTH:-4}${LOOKUP:+l$LOOKUP}${TEMP:+t$TEMP}${TAG:-}"
    ref=$REF24 split=(--limit "${LIMIT:-24}")
    if [ -n "${DEV:-}" ]; then
      ref=results/training/greedy-reference-dev16.json split=(--skip 24 --limit 16) tag="dev-$tag"
      [ -f "$ref" ] || python -m hf_xpress.training tau --reference "$ref" --sets humaneval,mtbench,math500 "${split[@]}"
    fi
    for refiner in ${REFINERS:-none markov xpress}; do
      name=${refiner/none/dflash}
      python -m hf_xpress.training tau --drafter "drafters/smollm2-135m-$name-b16" --reference "$ref" \
        --sets humaneval,mtbench,math500 "${split[@]}" --threads 1 --tree "${TREE:-3}" \
        --tree-budget "${BUDGET:-8}" --set "num_assistant_tokens=${DEPTH:-4}" ${LOOKUP:+--lookup "$LOOKUP"} \
        ${TEMP:+--set "tree_temperature=$TEMP"} --out "results/training/tau-$refiner-11-$tag.json" &
    done
    wait
    ;;
  ce-ab)
    # Twenty-second session: are the refiners' scores over-confident because of the TV term? (tree_temperature 1.5
    # helped both refiners, 1.0 was best for the CE-trained dFlash drafter; CE against the target's argmax is a proper
    # score for "this draft is accepted", TV against p_target is not.) The eleventh run's xPress folder continues
    # CE_STEPS (900) steps on mix7 with the eleventh run's recipe (slots 1..2, 8 sequences, lr 3e-4), side by side,
    # 1 thread each: the spec's 0.1 x CE + 0.9 x TV (control) against CE alone (--ce-weight 1 --tv-weight 0).
    # CE_LR=X (twenty-third session: 5e-5, so that the continuation does not dip under its start as it does at 3e-4)
    # runs both arms at that rate instead, into runs/smollm2-xpress-ce{0.1,1}-lrX.
    eleventh=$(folders_at "$ELEVENTH_RUN")
    for arm in "0.1 0.9" "1 0"; do
      set -- $arm
      REFINERS=xpress CONTINUE_STEPS=${CE_STEPS:-900} continue_shipped "-ce$1${CE_LR:+-lr$CE_LR}" data/smollm2-mix7 \
        "$MIX7_CACHE" "$eleventh" --loss-slots 2 --batch-size 8 --lr "${CE_LR:-3e-4}" --eval-every 300 \
        --ce-weight "$1" --tv-weight "$2" &
    done
    wait
    ;;
  tau-ce-ab)
    # ce-ab's two arms on the development split (prompts 25-40 of each set), 6-node dynamic trees 4 deep (what the
    # tree_temperature comparison used), at tree_temperature T (TEMPS, default "1.0 1.5"), the two arms side by side.
    tau_dev_arms "xpress-ce0.1${CE_LR:+-lr$CE_LR}" "xpress-ce1${CE_LR:+-lr$CE_LR}"
    ;;
  reg-ab)
    # Twenty-third session: the refiners are over-confident on new text and nearly calibrated on text they trained on
    # (scripts/calibration.py): a generalisation gap of their token-conditioned bias. Regularise it at the source: the
    # eleventh run's xPress folder continues CE_STEPS (900) steps with ce-ab's recipe (whose spec-mix arm,
    # runs/smollm2-xpress-ce0.1, is the control), side by side, 1 thread each: AdamW weight decay 1.0 on the refiner's
    # weights (-rwd1; the rest keeps 0.01) against dropout 0.1 on its features before the read-out (-rdrop0.1).
    # REG_ARMS (default "wd1 drop0.1"): wdX = --refiner-weight-decay X, dropX = --refiner-dropout X, run side by side.
    eleventh=$(folders_at "$ELEVENTH_RUN")
    for arm in ${REG_ARMS:-wd1 drop0.1}; do
      case $arm in
        wd*) flag=(--refiner-weight-decay "${arm#wd}") ;;
        drop*) flag=(--refiner-dropout "${arm#drop}") ;;
        *) echo "REG_ARMS: wdX or dropX, got $arm" >&2; exit 2 ;;
      esac
      REFINERS=xpress CONTINUE_STEPS=${CE_STEPS:-900} continue_shipped "-r$arm" data/smollm2-mix7 "$MIX7_CACHE" \
        "$eleventh" --loss-slots 2 --batch-size 8 --lr 3e-4 --eval-every 300 "${flag[@]}" &
    done
    wait
    ;;
  tau-reg-ab)
    # reg-ab's arms (REG_ARMS) as tau-ce-ab measured ce-ab's (development split, 6-node dynamic trees 4 deep, TEMPS).
    arms=()
    for arm in ${REG_ARMS:-wd1 drop0.1}; do arms+=("xpress-r$arm"); done
    tau_dev_arms "${arms[@]}"
    ;;
  ce-scratch)
    # Twenty-fifth session: CE alone for the whole refiner objective from the start of a run (ce-ab continued an
    # already trained folder, whose drafter scores the spec's TV share had made over-confident). Two xPress drafters
    # from random weights on mix7 with the eleventh run's per-step recipe (slots 1..2, 8 sequences), lr 1e-3 (the
    # from-scratch runs' rate), SCRATCH_STEPS (3000) steps, side by side, 1 thread each: the spec's 0.1 x CE + 0.9 x TV
    # against CE alone. Held-out every 500 steps on the later runs' split (48 sequences x 24 anchors).
    for arm in "0.1 0.9" "1 0"; do
      set -- $arm
      out="runs/smollm2-xpress-scratch-ce$1"
      [[ -d "$out/final" ]] && continue
      hf-xpress train "${COMMON[@]}" --data data/smollm2-mix7 --feature-cache "$MIX7_CACHE" --refiner xpress \
        --loss-slots 2 --batch-size 8 --max-steps "${SCRATCH_STEPS:-3000}" --eval-every 500 --heldout-seqs 48 \
        --eval-anchors 24 --ce-weight "$1" --tv-weight "$2" --out "$out" >> "$out.log" 2>&1 &
    done
    wait
    ;;
  tau-ce-scratch)
    # ce-scratch's two arms as tau-ce-ab measured ce-ab's (development split, 6-node dynamic trees 4 deep, TEMPS).
    tau_dev_arms xpress-scratch-ce0.1 xpress-scratch-ce1
    ;;
  grow-probe)
    # Capacity probe before a ninth run: the eighth run's dFlash drafter continues PROBE_STEPS (600) steps on mix7 as it
    # is (2 layers) and grown to 4 (--grow-layers 2: the new layers start as the identity), side by side, at a low lr
    # (2e-4: a short run must not spend itself recovering from the re-warmed rate); held-out estimates only.
    # (the folder is extracted once, before the runs start: two background jobs extracting it at once would race)
    eighth=$(folders_at "$EIGHTH_RUN")
    for arm in 0 2; do
      hf-xpress train "${COMMON[@]}" --data data/smollm2-mix7 --feature-cache "$MIX7_CACHE" --refiner none \
        --init-drafter "$eighth/smollm2-135m-dflash-b16" --grow-layers "$arm" --lr 2e-4 \
        --max-steps "${PROBE_STEPS:-600}" --eval-every 200 --heldout-seqs 48 --eval-anchors 24 \
        --out "runs/smollm2-none-probe-grow$arm" >> "runs/smollm2-none-probe-grow$arm.log" 2>&1 &
    done
    wait
    ;;
  lora)
    # Part 5: attach xPress to the trained dFlash drafter (LoRA r=16 on its layers and fc, refiner trained fully).
    hf-xpress train "${COMMON[@]}" --refiner xpress --init-drafter runs/smollm2-none/final --lora --lora-rank 16 \
      --max-steps 300 --out runs/smollm2-xpress-lora
    ;;
esac
