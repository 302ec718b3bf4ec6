#!/usr/bin/env bash
# Reproduces the committed SmolLM2-135M-Instruct benchmark results: run on a quiet machine. `drafts`, `run3*` and
# `draft-vocab` measure the third run's folders, `run4*` the fourth run's (both from git history); every other stage
# (`run5*` and later, `block*`, `tree*`, `dyn*`, `bf16`, `fp32`) measures drafters/ as it is now (their committed
# results came from the folders shipped at the time: `folders_at COMMIT` in scripts/folders_at.sh extracts those).
#
#   bash scripts/results_smollm2.sh block   # per-block latency, full vocabulary and refiner_shortlist=64
#   bash scripts/results_smollm2.sh bf16    # end to end, bf16, greedy and T = 1, every method
#   bash scripts/results_smollm2.sh drafts  # end to end, bf16, greedy: drafts per round and confidence threshold
#   bash scripts/results_smollm2.sh run3    # end to end, bf16, greedy: the third run's drafters, 15 vs 2 drafts
#   bash scripts/results_smollm2.sh run3-t1 # the same at T = 1, 2 drafts per round
#   bash scripts/results_smollm2.sh run3-speed  # the shipped settings only (2 drafts), for speed, caches dropped first
#   bash scripts/results_smollm2.sh run4-speed  # the same for the fourth run's drafters (shipped in the eighth session)
#   bash scripts/results_smollm2.sh run4-t1     # ... and at T = 1
#   bash scripts/results_smollm2.sh run4-speed2 # run4-speed again after draft_logits reads the head as one matmul (tenth session)
#   bash scripts/results_smollm2.sh run5-speed  # the fifth run's drafters (shipped in the tenth session), greedy
#   bash scripts/results_smollm2.sh run5-t1     # ... and at T = 1
#   bash scripts/results_smollm2.sh block5 [OUT-SUFFIX]  # per-block latency of the fifth-run xPress folder, shortlist 64
#   bash scripts/results_smollm2.sh run5-lookup  # run5-speed without the threshold, each of ours also with prompt lookup first
#   bash scripts/results_smollm2.sh run5-lookup-t1  # ... and at T = 1
#   bash scripts/results_smollm2.sh fp32-lookup  # fp32, greedy: ours with prompt lookup first, exactness (fails on a mismatch)
#   bash scripts/results_smollm2.sh run6-speed  # the sixth run's drafters (shipped in the eleventh session), greedy, with and without lookup
#   bash scripts/results_smollm2.sh run7-speed  # the seventh run's drafters (shipped in the twelfth session), the same
#   bash scripts/results_smollm2.sh run8-speed  # the eighth run's drafters (thirteenth session), the same + native DFlash
#   bash scripts/results_smollm2.sh run9-speed  # the ninth run's drafters (fifteenth session), the same as run8-speed
#   bash scripts/results_smollm2.sh run10-speed # the tenth run's drafters (sixteenth session), the same as run8-speed
#   bash scripts/results_smollm2.sh run11-speed # the eleventh run's drafters (seventeenth session), the same
#   bash scripts/results_smollm2.sh tree-speed  # the shipped drafters, chains (threshold 0 / 0.2) against trees of 2 and 3 branches
#   bash scripts/results_smollm2.sh tree-shape  # xPress trees: 3 or 4 branches of 2 or 3 drafts
#   bash scripts/results_smollm2.sh tree-lookup  # the shipped drafters: chain (threshold 0.2) and tree of 3, each with and without prompt lookup first
#   bash scripts/results_smollm2.sh tree-t1     # the shipped drafters at T = 1: chains against trees of 3
#   bash scripts/results_smollm2.sh dyn-shape   # xPress: dynamic trees of 6-12 nodes against the tree of 3 x 2 and the shipped chain
#   bash scripts/results_smollm2.sh dyn-speed   # the shipped drafters: chain, tree of 3 x 2, dynamic trees of 6 / 8 / 10 nodes
#   bash scripts/results_smollm2.sh dyn-lookup  # the shipped drafters: chain, dynamic tree of 6 nodes, each tree with lookup first / lookup as a branch; + baselines
#   bash scripts/results_smollm2.sh dyn-lookup-shape  # with lookup as a branch: dynamic trees of 6 / 8 / 10 nodes (Markov head, xPress)
#   bash scripts/results_smollm2.sh dyn-lookup-deep  # with lookup as a branch: 16-node trees 6 deep against 6 nodes 4 deep
#   bash scripts/results_smollm2.sh dyn-temp  # the refiners' dynamic trees at tree_temperature 1 and 1.5
#   bash scripts/results_smollm2.sh fp32-dyn-lookup  # fp32 exactness of dynamic trees with lookup as a branch (fails on a mismatch)
#   bash scripts/results_smollm2.sh draft-vocab  # shipped settings with / without the training vocabulary as draft vocabulary
#   bash scripts/results_smollm2.sh fp32    # end to end, fp32, greedy: exactness against plain generate
#   bash scripts/results_smollm2.sh cost    # the xPress drafter, bf16 then fp32: 2 / 4 / 15 drafts per round against the "cost" schedule
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/folders_at.sh
# drafter_args ARRAY DIR: ARRAY=(--drafter DIR/smollm2-135m-{dflash,markov,xpress}-b16)
drafter_args() {
  local -n args=$1
  local name
  args=()
  for name in dflash markov xpress; do args+=(--drafter "$2/smollm2-135m-$name-b16"); done
}
drafter_args D drafters
# The run3* / run4* stages measure earlier runs' folders, from git history (drafters/ holds the fifth run's).
export D3_DIR=$(folders_at "$THIRD_RUN")
drafter_args D3 "$D3_DIR"
drafter_args D4 "$(folders_at "$FOURTH_RUN")"
# Timing is only readable with little page cache held (docs/benchmarks.md): drop it first where allowed.
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "could not drop the page cache (not root)"; }
# Waits (up to 15 minutes) for the 1-minute load average to fall below 0.25: it lags, so a bench started right after
# another one reads as busy (the report then warns) although nothing else runs.
wait_quiet() {
  local i
  for i in $(seq 180); do
    awk '{exit !($1 < 0.25)}' /proc/loadavg && return 0
    sleep 5
  done
  echo "the load average stayed at $(cut -d' ' -f1 /proc/loadavg): timings will carry the report's warning"
}

# shipped_bench OUT DRAFTER-ARGS... BENCH-ARGS...: the shipped settings only (2 drafts per round, shortlist 64, xPress
# K = 2 with early stop), page cache dropped and the machine quiet first; results in OUT$SUFFIX (SUFFIX=-xeon keeps
# another host's run apart). NATIVE=1 adds transformers' native DFlash path with the dFlash drafter.
shipped_bench() {
  local out=$1${SUFFIX:-}; shift
  local native=(--no-native-dflash)
  [[ -n ${NATIVE:-} ]] && native=()
  drop_caches
  wait_quiet
  hf-xpress bench "$@" --sets humaneval,mtbench,math500 --limit 3 --max-new-tokens 96 --passes 2 --early-stop on \
    --shortlist 64 --drafts 2 ${native[@]+"${native[@]}"} --dtype bfloat16 --threads 2 --out "$out"
}
# speed OUT DRAFTER-ARGS...: greedy, with and without the confidence threshold. t1: the same at T = 1 (no threshold).
speed() { shipped_bench "$@" --temperature 0 --confidence 0,0.2; }
t1() { shipped_bench "$@" --temperature 1; }

case "${1:-all}" in
  block|all)
    hf-xpress bench --block-only --drafter drafters/smollm2-135m-xpress-b16 --dtype bfloat16 --threads 2 \
      --block-repeats 100 --block-compiled --out results/block-smollm2-bf16 --no-progress
    hf-xpress bench --block-only --drafter drafters/smollm2-135m-xpress-b16 --dtype bfloat16 --threads 2 \
      --block-repeats 100 --shortlist 64 --block-compiled --out results/block-smollm2-bf16-sl64 --no-progress
    ;;&
  bf16|all)
    hf-xpress bench "${D[@]}" --sets humaneval,mtbench,math500 --limit 3 --max-new-tokens 96 \
      --temperature 0 --temperature 1 --passes 2,4,6 --early-stop on --shortlist none,64 --dtype bfloat16 \
      --threads 2 --out results/smollm2-bf16-s2
    ;;&
  drafts|all)
    # Drafts per round (num_assistant_tokens) and the confidence threshold, greedy, bf16 (third session).
    hf-xpress bench "${D3[@]}" --sets humaneval,mtbench,math500 --limit 3 --max-new-tokens 96 --temperature 0 \
      --passes 2 --early-stop on --shortlist 64 --drafts none,2,4 --confidence 0,0.2 --no-native-dflash \
      --dtype bfloat16 --threads 2 --out results/smollm2-bf16-drafts
    ;;&
  run3|all)
    # The third training run's drafters (shipped with 2 drafts per round as their default; the bench sets every
    # knob explicitly per method, so "none" is the full block).
    hf-xpress bench "${D3[@]}" --sets humaneval,mtbench,math500 --limit 3 --max-new-tokens 96 --temperature 0 \
      --passes 2 --early-stop on --shortlist 64 --drafts none,2 --confidence 0,0.2 --no-native-dflash \
      --dtype bfloat16 --threads 2 --out results/smollm2-bf16-run3
    ;;&
  run3-t1|all)
    t1 results/smollm2-bf16-run3-t1 "${D3[@]}"
    ;;&
  run3-speed|all)
    speed results/smollm2-bf16-run3-speed "${D3[@]}"
    ;;&
  run4-t1)
    t1 results/smollm2-bf16-run4-t1 "${D4[@]}"
    ;;
  run4-speed)
    speed results/smollm2-bf16-run4-speed "${D4[@]}"
    ;;
  run4-speed2)
    speed results/smollm2-bf16-run4-speed2 "${D4[@]}"
    ;;
  tree-speed)
    # Eighteenth session: tree verification (hf_xpress.tree_decoding; greedy) of 2 and 3 slot-1 branches, 2 drafts
    # per branch, against the chains at the shipped settings, bf16, same prompts, interleaved.
    speed results/smollm2-bf16-tree-speed "${D[@]}" --tree none,2,3
    ;;
  tree-shape)
    # The shipped xPress drafter's tree: 3 or 4 slot-1 branches x 2 or 3 drafts per branch, bf16, greedy.
    drop_caches
    wait_quiet
    hf-xpress bench --drafter drafters/smollm2-135m-xpress-b16 --sets humaneval,mtbench,math500 --limit 3 \
      --max-new-tokens 96 --passes 2 --early-stop on --shortlist 64 --drafts 2,3 --tree 3,4 --no-prompt-lookup \
      --no-native-dflash --temperature 0 --dtype bfloat16 --threads 2 --out "results/smollm2-bf16-tree-shape${SUFFIX:-}"
    ;;
  dyn-shape)
    # Nineteenth session: dynamic trees (tree_budget: the drafter's N most probable draft nodes, up to n deep) against
    # the fixed tree of 3 x 2 drafts and the shipped chain, the shipped xPress drafter, bf16, greedy, interleaved.
    drop_caches
    wait_quiet
    X="xpress K=2 es sl64"
    hf-xpress bench --drafter drafters/smollm2-135m-xpress-b16 --sets humaneval,mtbench,math500 --limit 3 \
      --max-new-tokens 96 --passes 2 --early-stop on --shortlist 64 --drafts 2,4,5 --confidence 0.2 --tree none,3,4 \
      --tree-budget none,6,8,10,12 --no-prompt-lookup --no-native-dflash --temperature 0 --dtype bfloat16 --threads 2 \
      --methods "$X n2 c0.2,$X n2 tree3,$X n4 tree3b6,$X n4 tree3b8,$X n5 tree4b10,$X n5 tree4b12" \
      --out "results/smollm2-bf16-dyn-shape${SUFFIX:-}"
    ;;
  dyn-speed)
    # Nineteenth session: the three shipped drafters, each as the shipped chain (threshold 0.2), the fixed tree of
    # 3 x 2 drafts and dynamic trees of 6 / 8 nodes up to 4 deep and 10 nodes up to 5 deep; bf16, greedy, interleaved.
    drop_caches
    wait_quiet
    M=()
    for m in "dflash" "markov sl64" "xpress K=2 es sl64"; do
      M+=("$m n2 c0.2" "$m n2 tree3" "$m n4 tree3b6" "$m n4 tree3b8" "$m n5 tree4b10")
    done
    hf-xpress bench "${D[@]}" --sets humaneval,mtbench,math500 --limit 3 --max-new-tokens 96 --passes 2 \
      --early-stop on --shortlist 64 --drafts 2,4,5 --confidence 0.2 --tree none,3,4 --tree-budget none,6,8,10 \
      --no-prompt-lookup --no-native-dflash --temperature 0 --dtype bfloat16 --threads 2 \
      --methods "$(IFS=,; echo "${M[*]}")" --out "results/smollm2-bf16-dyn-speed${SUFFIX:-}"
    ;;
  dyn-lookup)
    # Twentieth session: the shipped drafters as the shipped chain (threshold 0.2) and as dynamic trees of 6 nodes up to
    # 4 deep, each tree also with prompt lookup first (' +pld': a lookup round verifies lookup's continuation alone)
    # and with lookup's continuation joining the drafter's tree (' +pldb', `lookup_branch=True`); plain, prompt lookup
    # and transformers' native DFlash path too; bf16, greedy, interleaved, 4 prompts per set.
    drop_caches
    wait_quiet
    M=(plain pld native-dflash)
    for m in "dflash" "markov sl64" "xpress K=2 es sl64"; do
      M+=("$m n2 c0.2" "$m n4 tree3b6" "$m n4 tree3b6 +pld" "$m n4 tree3b6 +pldb")
    done
    hf-xpress bench "${D[@]}" --sets humaneval,mtbench,math500 --limit "${LIMIT:-4}" --max-new-tokens 96 --passes 2 \
      --early-stop on --shortlist 64 --drafts 2,4 --confidence 0.2 --tree none,3 --tree-budget 6 \
      --with-lookup off,on,branch --temperature 0 --dtype bfloat16 --threads 2 \
      --methods "$(IFS=,; echo "${M[*]}")" --out "results/smollm2-bf16-dyn-lookup${SUFFIX:-}"
    ;;
  dyn-lookup-shape)
    # Twentieth session: with lookup as a branch, which dynamic tree? The refiners' trees of 6 / 8 nodes up to 4 deep
    # and 10 nodes up to 5 deep, bf16, greedy, interleaved, 4 prompts per set.
    drop_caches
    wait_quiet
    M=(plain)
    for m in "markov sl64" "xpress K=2 es sl64"; do
      M+=("$m n4 tree3b6 +pldb" "$m n4 tree3b8 +pldb" "$m n5 tree4b10 +pldb")
    done
    hf-xpress bench "${D[@]}" --sets humaneval,mtbench,math500 --limit "${LIMIT:-4}" --max-new-tokens 96 --passes 2 \
      --early-stop on --shortlist 64 --drafts 4,5 --tree 3,4 --tree-budget 6,8,10 --with-lookup branch \
      --no-prompt-lookup --no-native-dflash --temperature 0 --dtype bfloat16 --threads 2 \
      --methods "$(IFS=,; echo "${M[*]}")" --out "results/smollm2-bf16-dyn-lookup-shape${SUFFIX:-}"
    ;;
  dyn-lookup-deep)
    # Twenty-first session: with lookup as a branch, the deep trees where xPress led the Markov head in acceptance
    # (16 nodes, 4 children per node, up to 6 deep) against the 6-node trees 4 deep, and the deep tree alone; bf16,
    # greedy, interleaved, 8 prompts per set.
    drop_caches
    wait_quiet
    M=(plain pld)
    for m in "dflash" "markov sl64" "xpress K=2 es sl64"; do
      M+=("$m n4 tree3b6 +pldb" "$m n6 tree4b16" "$m n6 tree4b16 +pldb")
    done
    hf-xpress bench "${D[@]}" --sets humaneval,mtbench,math500 --limit "${LIMIT:-8}" --max-new-tokens 96 --passes 2 \
      --early-stop on --shortlist 64 --drafts 4,6 --tree 3,4 --tree-budget 6,16 --with-lookup off,branch \
      --no-native-dflash --temperature 0 --dtype bfloat16 --threads 2 \
      --methods "$(IFS=,; echo "${M[*]}")" --out "results/smollm2-bf16-dyn-lookup-deep${SUFFIX:-}"
    ;;
  dyn-temp)
    # Twenty-first session: the refiners' 6-node dynamic trees 4 deep ranked at tree_temperature 1 and 1.5 (the
    # shipped value), alone and with lookup as a branch; bf16, greedy, interleaved, 8 prompts per set.
    drop_caches
    wait_quiet
    M=(plain)
    for m in "markov sl64" "xpress K=2 es sl64"; do
      M+=("$m n4 tree3b6 t1" "$m n4 tree3b6 t1.5" "$m n4 tree3b6 t1 +pldb" "$m n4 tree3b6 t1.5 +pldb")
    done
    hf-xpress bench "${D[@]}" --sets humaneval,mtbench,math500 --limit "${LIMIT:-8}" --max-new-tokens 96 --passes 2 \
      --early-stop on --shortlist 64 --drafts 4 --tree 3 --tree-budget 6 --tree-temperature 1,1.5 \
      --with-lookup off,branch --no-prompt-lookup --no-native-dflash --temperature 0 --dtype bfloat16 --threads 2 \
      --methods "$(IFS=,; echo "${M[*]}")" --out "results/smollm2-bf16-dyn-temp${SUFFIX:-}"
    ;;
  tree-lookup)
    # Eighteenth session: the shipped chains (threshold 0.2) and trees of 3 slot-1 branches, each also with prompt
    # lookup first (a lookup round verifies lookup's continuation as one branch), bf16, greedy.
    shipped_bench results/smollm2-bf16-tree-lookup "${D[@]}" --temperature 0 --confidence 0.2 --tree none,3 \
      --with-lookup off,on
    ;;
  tree-t1)
    # Eighteenth session: at T = 1 the tree samples the target at each node and follows the matching branch; the
    # chains use speculative (rejection) sampling with the drafter's q.
    t1 results/smollm2-bf16-tree-t1 "${D[@]}" --tree none,3
    ;;
  run5-t1)
    t1 results/smollm2-bf16-run5-t1 "${D[@]}"
    ;;
  run5-speed)
    speed results/smollm2-bf16-run5-speed "${D[@]}"
    ;;
  run5-lookup)
    # Eleventh session: ours with and without prompt lookup first (`generate(..., prompt_lookup_num_tokens=10)`:
    # the drafter runs only where lookup finds no continuation), greedy, no confidence threshold.
    shipped_bench results/smollm2-bf16-run5-lookup "${D[@]}" --temperature 0 --with-lookup off,on
    ;;
  run6-speed)
    speed results/smollm2-bf16-run6-speed "${D[@]}" --with-lookup off,on
    ;;
  run7-speed)
    speed results/smollm2-bf16-run7-speed "${D[@]}" --with-lookup off,on
    ;;
  run8-speed|run9-speed|run10-speed|run11-speed)
    # The shipped drafters (eighth run: thirteenth session; ninth: fifteenth; tenth: sixteenth; eleventh: seventeenth)
    # as run7-speed, with transformers' native DFlash path too (the issue's goal: xPress ahead of it);
    # results/smollm2-bf16-<stage>.
    NATIVE=1 speed "results/smollm2-bf16-$1" "${D[@]}" --with-lookup off,on
    ;;
  run5-lookup-t1)
    shipped_bench results/smollm2-bf16-run5-lookup-t1 "${D[@]}" --temperature 1 --with-lookup off,on
    ;;
  fp32-lookup)
    hf-xpress bench "${D[@]}" --sets humaneval,mtbench,math500 --limit 4 --max-new-tokens 96 --temperature 0 \
      --passes 2 --early-stop on --shortlist 64 --drafts 2 --no-native-dflash --no-prompt-lookup --with-lookup on \
      --dtype float32 --threads 2 --fail-on-mismatch --out results/smollm2-fp32-lookup --no-progress
    ;;
  fp32-dyn-lookup)
    # Twentieth session: exactness of dynamic trees with prompt lookup as a branch, fp32, every shipped drafter
    # (fails on any mismatch); 4 prompts per set.
    M=(plain)
    for m in "dflash" "markov sl64" "xpress K=2 es sl64"; do M+=("$m n4 tree3b6 +pldb"); done
    hf-xpress bench "${D[@]}" --sets humaneval,mtbench,math500 --limit 4 --max-new-tokens 96 --temperature 0 \
      --passes 2 --early-stop on --shortlist 64 --drafts 4 --tree 3 --tree-budget 6 --with-lookup branch \
      --no-native-dflash --no-prompt-lookup --dtype float32 --threads 2 --fail-on-mismatch \
      --methods "$(IFS=,; echo "${M[*]}")" --out results/smollm2-fp32-dyn-lookup --no-progress
    ;;
  block5)
    # Tenth session: run twice, the second time as `block5 b` (results/block-smollm2-bf16-sl64-run5b).
    hf-xpress bench --block-only --drafter drafters/smollm2-135m-xpress-b16 --dtype bfloat16 --threads 2 \
      --block-repeats 100 --shortlist 64 --block-compiled --out "results/block-smollm2-bf16-sl64-run5${2:-}" --no-progress
    ;;
  block11)
    # Twenty-fifth session: the shipped (eleventh-run) xPress folder, after the refiner's two-copies-fewer change.
    hf-xpress bench --block-only --drafter drafters/smollm2-135m-xpress-b16 --dtype bfloat16 --threads 2 \
      --block-repeats 100 --shortlist 64 --block-compiled --out "results/block-smollm2-bf16-sl64-run11${2:-}" --no-progress
    ;;
  block11-profile)
    # Thirty-third session: the same, with the operator profile (--block-profile) and the goal's interleaved timing.
    hf-xpress bench --block-only --drafter drafters/smollm2-135m-xpress-b16 --dtype bfloat16 --threads 2 \
      --block-repeats 100 --shortlist 64 --block-profile --out "results/block-smollm2-bf16-sl64-run11-profile${2:-}" \
      --no-progress
    ;;
  draft-vocab)
    # The third run's drafters with their training vocabulary (8,192 tokens) as draft vocabulary, against the whole
    # vocabulary, at the shipped settings (2 drafts); copies under runs/draft-vocab.
    python - <<'PY'
import json, os, shutil
from pathlib import Path
from hf_xpress import XPressDrafterModel
from hf_xpress.training import run_training_vocabulary
for name in ("dflash", "markov", "xpress"):
    src, dst = Path(f"{os.environ['D3_DIR']}/smollm2-135m-{name}-b16"), Path(f"runs/draft-vocab/smollm2-135m-{name}-b16")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    model = XPressDrafterModel.from_pretrained(dst)
    cfg = json.loads((src / "training_history.json").read_text())["config"]
    model.set_draft_vocab(run_training_vocabulary(cfg, model.config.vocab_size))
    model.save_pretrained(dst)
    print(dst, model.config.draft_vocab_size)
PY
    drop_caches
    hf-xpress bench --drafter runs/draft-vocab/smollm2-135m-dflash-b16 --drafter runs/draft-vocab/smollm2-135m-markov-b16 \
      --drafter runs/draft-vocab/smollm2-135m-xpress-b16 --sets humaneval,mtbench,math500 --limit 3 \
      --max-new-tokens 96 --temperature 0 --passes 2 --early-stop on --shortlist 64 --drafts 2 --draft-vocab on,off \
      --no-native-dflash --dtype bfloat16 --threads "${THREADS:-2}" --out results/smollm2-bf16-draft-vocab
    ;;
  fp32|all)
    hf-xpress bench "${D[@]}" --sets humaneval,mtbench,math500 --limit 2 --max-new-tokens 64 --passes 4 \
      --early-stop on,off --shortlist none,64 --dtype float32 --threads 2 --fail-on-mismatch \
      --out results/smollm2-fp32-exactness-s2
    ;;&
  cost|all)
    # Drafts per round from measured costs (num_assistant_tokens_schedule="cost", thirty-first session) against
    # fixed counts, all with the shipped threshold 0.2; bf16 (speed) then fp32 (where fixed counts lose, and exact).
    M="plain,xpress K=2 es sl64 n2 c0.2,xpress K=2 es sl64 n4 c0.2,xpress K=2 es sl64 c0.2,xpress K=2 es sl64 c0.2 cost"
    for dtype in bfloat16 float32; do
      hf-xpress bench --drafter drafters/smollm2-135m-xpress-b16 --sets humaneval,mtbench,math500 --limit 8 \
        --max-new-tokens 96 --passes 2 --early-stop on --shortlist 64 --drafts 2,4,none --confidence 0.2 \
        --schedule constant,cost --methods "$M" --no-native-dflash --no-prompt-lookup --dtype $dtype --threads 2 \
        --out results/smollm2-$([[ $dtype == bfloat16 ]] && echo bf16 || echo fp32)-cost-schedule --no-progress
    done
    ;;
esac
