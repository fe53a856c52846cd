#!/usr/bin/env bash
# The GPU checks and measurements, from a clone (after scripts/setup.sh, or any environment where the
# project imports), in sets that each fit one 9-minute command (their stage limits summed):
#   bash scripts/gpu_check.sh                 # SET=default: doctor, build, check, bench
#   SET=train bash scripts/gpu_check.sh       # build, lora_step, full_step
#   SET=update bash scripts/gpu_check.sh      # build, update_today, update_profile, update_mixed
#   SET=memory bash scripts/gpu_check.sh      # build, memory_plan, lora_step (issue 55: the plan on a GPU)
#   SET=learning bash scripts/gpu_check.sh    # speedrun (issue 58: does a start built at the GPU's pace copy?)
#   bash scripts/gpu_check.sh --plan          # print each set's stages and limits; run nothing
#   STAGES="doctor bench" bash scripts/gpu_check.sh   # any stages, in the order below
# Each stage runs under its own limit (printed with it; NAME_S=seconds overrides one), writing its log
# to $OUT/NAME.log and one line to $OUT/stages.txt:
#   doctor     `skyrl-tool-agent doctor`: device, memory, bf16, graph capture, one tiny training step,
#              4-bit matmul, NCCL and ZeRO-3 on one rank, MCP servers, data, disk
#   build      the Qwen2.5-1.5B-shaped model (random bf16 weights) the later stages load, once
#   check      the engine on CUDA: graphs = eager, Triton = torch attention, bf16 log-prob error
#   bench      benchmarks/bench_rollout.py on the 1.5B shape: today's kernel sampler, model.generate,
#              RolloutEngine at 64 and 256 rows
#   lora_step  the gpu profile's worst-case step: 16 tasks x 16 episodes, 8 turns x 512 tokens,
#              every group kept (update included), seconds split and peak GPU memory (metrics.jsonl)
#   memory_plan  the memory plan against torch.cuda.max_memory_allocated, part by part (update micro-batch,
#              KV cache, snapshot, prefill chunk), LoRA then QLoRA (benchmarks/check_memory_plan.py)
#   full_step  one full-mode (ZeRO-3) step through the DeepSpeed launcher on one GPU (a small rollout)
#   update_today    today's path for comparison: .old/'s profile_update.py, when .old/ holds an earlier
#              commit's code (`git archive REV skyrl_tool_agent benchmarks | tar -x -C .old`; carry it)
#   update_profile  where the profile's update time goes (benchmarks/profile_update.py, one micro-batch of
#              8 x 6,144 tokens, each change alone: new, casts, logits, no_ckpt)
#   update_mixed  passes by token budget vs by row count on 16 rows of lengths 768..6,144
#   speedrun   `skyrl-tool-agent speedrun --minutes 8.5`: a 384 x 6 start built from nothing at the GPU's
#              pace, GRPO beside continued SFT, dev greedy and avg@8 with the error anatomy of each
#              (issue 58: the shipped 3.5M start retypes the query it ran in 56 of its 136 wrong dev
#              answers, which no CPU lever moved; the start's `retyped` count is the figure to read)
# Random weights never stop a turn and never earn a reward, so the 1.5B-shaped figures are a rollout's
# worst case and say nothing about learning. A machine that cannot install the project from an index
# may carry wheels in .whl/ with an .whl/on_gpu.sh that installs them and sets the environment:
# sourced when present, else skipped.
#
# Adding a stage: a `stage_NAME` function, its limit in LIMIT, its name in a set of SETS (keep each
# set's sum within SET_LIMIT_S: `--plan` and tests/test_doctor.py check it).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
MODEL_DIR=${MODEL_DIR:-/tmp/q15}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"

#: One lent command runs 10 minutes at most: a set's limits sum to at most 9, the rest is slack.
SET_LIMIT_S=540
declare -A LIMIT=(
  [doctor]=${DOCTOR_S:-200} [build]=${BUILD_S:-60} [check]=${CHECK_S:-90} [bench]=${BENCH_S:-170}
  [lora_step]=${LORA_S:-300} [full_step]=${FULL_S:-150} [memory_plan]=${MEMORY_S:-150}
  [update_today]=${TODAY_S:-75} [update_profile]=${PROFILE_S:-100} [update_mixed]=${MIXED_S:-60}
  [speedrun]=${SPEEDRUN_S:-535}
)
ORDER="doctor build check bench memory_plan lora_step full_step update_today update_profile update_mixed speedrun"
declare -A SETS=(
  [default]="doctor build check bench"
  [train]="build lora_step full_step"
  [update]="build update_today update_profile update_mixed"
  [memory]="build memory_plan lora_step"
  [learning]="speedrun"
)
SET_NAMES="default train update memory learning"  # the sets in the order --plan prints them

plan() {  # the stages of $1 (a list of names) with their limits, and the sum
  local total=0 name
  for name in $1; do
    total=$(( total + LIMIT[$name] ))
    printf '%s (%s s) ' "$name" "${LIMIT[$name]}"
  done
  printf '= %s s of limits\n' "$total"
}
if [ "${1:-}" = "--plan" ]; then
  for set in $SET_NAMES; do
    printf 'SET=%s: ' "$set"
    plan "${SETS[$set]}"
  done
  exit 0
fi
SET=${SET:-default}
if [ -z "${STAGES:-}" ] && [ -z "${SETS[$SET]+x}" ]; then
  echo "error: SET=$SET is not a set (${SET_NAMES// /, }); or name stages with STAGES=\"...\"" >&2
  exit 2
fi
STAGES=${STAGES:-${SETS[$SET]}}
for name in $STAGES; do
  [ -n "${LIMIT[$name]+x}" ] || { echo "error: no stage $name (stages: $ORDER)" >&2; exit 2; }
done

mkdir -p "$OUT"
: > "$OUT/stages.txt"
if [ -f .whl/on_gpu.sh ]; then
  source .whl/on_gpu.sh >> "$OUT/stages.txt" 2>&1 || { cat "$OUT/stages.txt"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$OUT/stages.txt" 2>&1
echo "stages: $(plan "$STAGES")" | tee -a "$OUT/stages.txt"

stage_doctor() { "$PY" -m skyrl_tool_agent.commands.main doctor; }
stage_build() {
  if [ -f "$MODEL_DIR/config.json" ]; then echo "already built: $MODEL_DIR"; return 0; fi
  "$PY" -m skyrl_tool_agent.commands.main build-model --random-shape qwen2.5-1.5b --output-dir "$MODEL_DIR"
}
stage_check() { "$PY" benchmarks/check_engine_gpu.py; }
stage_bench() {
  "$PY" benchmarks/bench_rollout.py --model "$MODEL_DIR" --rows 64,256 --new-tokens 512 \
    --baseline-new-tokens 128 --json-out "$OUT/bench_rollout.json"
}
common=(--set model.name_or_path="$MODEL_DIR" --set training.max_steps=1 --set training.time_budget_minutes=null
        --set training.job_budget_minutes=null --set grpo.batcher.enabled=false --set grpo.filter_uniform_groups=false
        --set training.checkpoint_every=0)
stage_memory_plan() {
  "$PY" benchmarks/check_memory_plan.py --model "$MODEL_DIR" --json-out "$OUT/memory_plan_lora.json"
  local rc=$?
  "$PY" benchmarks/check_memory_plan.py --model "$MODEL_DIR" --mode qlora --json-out "$OUT/memory_plan_qlora.json" || true
  return $rc
}
stage_lora_step() {
  "$PY" training/scripts/train_grpo.py --mode lora --profile gpu "${common[@]}" \
    --set training.eval_num_tasks=1 --set training.eval_samples=0 --set training.probe_tasks=0 --set training.probe_held_out_tasks=0 --output-dir /tmp/run_lora
  local rc=$?
  cp /tmp/run_lora/metrics.jsonl "$OUT/lora_metrics.jsonl" 2>/dev/null
  return $rc
}
stage_full_step() {
  "$PY" -m deepspeed.launcher.runner --num_gpus 1 training/scripts/train_grpo.py \
    --mode full --profile gpu "${common[@]}" --set training.tasks_per_step=2 --set grpo.group_size=2 \
    --set grpo.max_turns=1 --set grpo.max_new_tokens_per_turn=16 --set training.eval_num_tasks=2 \
    --set env.collector.concurrency=4 --output-dir /tmp/run_full
  local rc=$?
  grep -h '"time/' /tmp/run_full/metrics.jsonl 2>/dev/null
  return $rc
}
stage_update_today() {  # today's path: the same measurement on an earlier commit
  [ -f .old/benchmarks/profile_update.py ] || { echo "skipped: no .old/benchmarks/profile_update.py"; return 0; }
  "$PY" .old/benchmarks/profile_update.py --model "$MODEL_DIR" --out "$OUT/update_today.json"
}
stage_speedrun() {  # its own budget (8.5 min, from its start) inside the stage's limit
  "$PY" -m skyrl_tool_agent.commands.main speedrun --minutes 8.5 --output-dir "$OUT/speedrun"
}
stage_update_profile() { "$PY" benchmarks/profile_update.py --model "$MODEL_DIR" --out "$OUT/update_new.json"; }
stage_update_mixed() {
  "$PY" benchmarks/profile_update.py --model "$MODEL_DIR" --rows 16 --mixed --variants new,rows --profile-variant '' \
    --out "$OUT/update_mixed.json"
}

for name in $ORDER; do
  case " $STAGES " in *" $name "*) ;; *) continue ;; esac
  limit=${LIMIT[$name]}
  echo "$name: limit $limit s" | tee -a "$OUT/stages.txt"
  start=$(date +%s)
  # the stage's function in a child bash under `timeout` (a hung stage is killed at its limit)
  timeout "$limit" bash -c "$(declare -p OUT MODEL_DIR PY common); $(declare -f "stage_$name"); stage_$name" \
    > "$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc in $(( $(date +%s) - start )) s (limit $limit s)" | tee -a "$OUT/stages.txt"
done
cat "$OUT/stages.txt"
