#!/usr/bin/env bash
# The rollout engine's GPU goals (issue 46), in one device command of at most 9 minutes, today's path
# beside the new one where there is one: `bash scripts/gpu_engine_check.sh` on the GPU machine, with
# .old/ holding the previous commit's code (`git archive 5b5bf6b skyrl_tool_agent benchmarks | tar -x
# -C .old`) and, where the machine has no index, .whl/ (carry both). Each stage prints its own limit;
# the limits add up to 500 s plus the two model builds (~40 s).
#   engine   1.5B engine tokens/s at 64 and 256 rows x 512 tokens, beside today's engine (old:engine)
#   modes    full mode (ZeRO-3, one rank: a gathered snapshot) vs LoRA through the engine, 64 and 256 rows
#   lora7b   a 7B-shaped LoRA step at the gpu profile's concurrency (256 episodes in flight, 6,144-token
#            episodes: the slot plan in the log), turns cut to 1 x 64 tokens so it fits the command
# Random bf16 weights of the real shapes (`build-model --random-shape`): figures for speed and memory only.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_engine}
mkdir -p "$OUT"
: > "$OUT/stages.txt"
if [ -f .whl/on_gpu.sh ]; then
  source .whl/on_gpu.sh >> "$OUT/stages.txt" 2>&1 || { cat "$OUT/stages.txt"; exit 1; }
fi
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$OUT/stages.txt" 2>&1
STAGES=${STAGES:-engine modes lora7b}
stage() {
  local name=$1 limit=$2 start rc
  shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  echo "$name: limit $limit s" | tee -a "$OUT/stages.txt"
  start=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/stages.txt"
}
build() {  # build the random-weight model of shape $1 into $2 once
  [ -f "$2/config.json" ] || "$PY" -m skyrl_tool_agent.commands.main build-model --random-shape "$1" \
    --output-dir "$2" >> "$OUT/stages.txt" 2>&1
}
build qwen2.5-1.5b /tmp/q15
old=(--variants engine); [ -f .old/benchmarks/bench_rollout.py ] && old=(--old .old --variants old:engine,engine)
stage engine 170 "$PY" benchmarks/bench_rollout.py --model /tmp/q15 --rows 64,256 --new-tokens 512 "${old[@]}" \
  --json-out "$OUT/bench_rollout.json"
stage modes 150 "$PY" benchmarks/bench_modes.py --device cuda --model /tmp/q15 --modes lora,full --rows 256 \
  --new-tokens 256 --json-out "$OUT/bench_modes.json"
build qwen2.5-7b /tmp/q7
stage lora7b 180 "$PY" training/scripts/train_grpo.py --mode lora --profile gpu --set model.name_or_path=/tmp/q7 \
  --set training.max_steps=1 --set training.time_budget_minutes=null --set grpo.batcher.enabled=false \
  --set grpo.filter_uniform_groups=false --set training.checkpoint_every=0 --set grpo.max_turns=1 \
  --set grpo.max_new_tokens_per_turn=64 --set training.eval_num_tasks=1 --set training.eval_samples=0 \
  --set training.probe_tasks=0 --set training.probe_held_out_tasks=0 --output-dir /tmp/run_lora7b
grep -h "rollout engine:" "$OUT/lora7b.log" >> "$OUT/stages.txt"
cp /tmp/run_lora7b/metrics.jsonl "$OUT/lora7b_metrics.jsonl" 2>/dev/null
cat "$OUT/stages.txt"
