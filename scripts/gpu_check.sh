#!/usr/bin/env bash
# The GPU checks and measurements, in one command on a GPU machine, from a clone (after
# scripts/setup.sh, or any environment where the project imports): `bash scripts/gpu_check.sh`.
# Stages run in order of importance, each under its own time limit, each writing its log to $OUT:
#   doctor     `skyrl-tool-agent doctor`: device, memory, bf16, graph capture, one tiny training step
#   check      the engine on CUDA: graphs = eager, Triton = torch attention, bf16 log-prob error
#   bench      benchmarks/bench_rollout.py on a Qwen2.5-1.5B-shaped model (random bf16 weights):
#              today's kernel sampler, model.generate, RolloutEngine at 64 and 256 rows
#   lora_step  the gpu profile's worst-case step: 16 tasks x 16 episodes, 8 turns x 512 tokens,
#              every group kept (update included), seconds split and peak GPU memory (metrics.jsonl)
#   full_step  one full-mode (ZeRO-3) step through the DeepSpeed launcher on one GPU (a small rollout)
#   update_today    today's path for comparison: .old/'s profile_update.py, when .old/ holds an earlier
#              commit's code (`git archive REV skyrl_tool_agent benchmarks | tar -x -C .old`; carry it)
#   update_profile  where the profile's update time goes (benchmarks/profile_update.py, one micro-batch of
#              8 x 6,144 tokens, each change alone: new, casts, logits, no_ckpt)
#   update_mixed  passes by token budget vs by row count on 16 rows of lengths 768..6,144
# The 1.5B-shaped model is written by `build-model --random-shape qwen2.5-1.5b`: random weights never
# stop a turn and never earn a reward, so its figures are a rollout's worst case and say nothing about
# learning. A machine that cannot install the project from an index may carry wheels in .whl/ with an
# .whl/on_gpu.sh that installs them and sets the environment: sourced when present, else skipped.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
MODEL_DIR=${MODEL_DIR:-/tmp/q15}
mkdir -p "$OUT"
: > "$OUT/stages.txt"
if [ -f .whl/on_gpu.sh ]; then
  source .whl/on_gpu.sh >> "$OUT/stages.txt" 2>&1 || { cat "$OUT/stages.txt"; exit 1; }
fi
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$OUT/stages.txt" 2>&1
STAGES=${STAGES:-doctor check bench lora_step full_step update_today update_profile update_mixed}  # a subset reruns part of it
stage() {
  local name=$1 limit=$2 start rc
  shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  start=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/stages.txt"
}
stage doctor "${DOCTOR_S:-150}" "$PY" -m skyrl_tool_agent.commands.main doctor
case " $STAGES " in *" bench "*|*" lora_step "*|*" full_step "*|*" update_"*)
  [ -f "$MODEL_DIR/config.json" ] || "$PY" -m skyrl_tool_agent.commands.main build-model \
    --random-shape qwen2.5-1.5b --output-dir "$MODEL_DIR" >> "$OUT/stages.txt" 2>&1 ;;
esac
stage check "${CHECK_S:-90}" "$PY" benchmarks/check_engine_gpu.py
stage bench "${BENCH_S:-170}" "$PY" benchmarks/bench_rollout.py --model "$MODEL_DIR" --rows 64,256 --new-tokens 512 \
  --baseline-new-tokens 128 --json-out "$OUT/bench_rollout.json"
common=(--set model.name_or_path="$MODEL_DIR" --set training.max_steps=1 --set training.time_budget_minutes=null
        --set grpo.batcher.enabled=false --set grpo.filter_uniform_groups=false --set training.checkpoint_every=0)
stage lora_step "${LORA_S:-240}" "$PY" training/scripts/train_grpo.py --mode lora --profile gpu "${common[@]}" \
  --set training.eval_num_tasks=1 --set training.eval_samples=0 --set training.probe_tasks=0 --output-dir /tmp/run_lora
cp /tmp/run_lora/metrics.jsonl "$OUT/lora_metrics.jsonl" 2>/dev/null
stage full_step "${FULL_S:-120}" "$PY" -m deepspeed.launcher.runner --num_gpus 1 training/scripts/train_grpo.py \
  --mode full --profile gpu "${common[@]}" --set training.tasks_per_step=2 --set grpo.group_size=2 \
  --set grpo.max_turns=1 --set grpo.max_new_tokens_per_turn=16 --set training.eval_num_tasks=2 \
  --set env.collector.concurrency=4 --output-dir /tmp/run_full
grep -h '"time/' /tmp/run_full/metrics.jsonl >> "$OUT/full_step.log" 2>/dev/null
[ -f .old/benchmarks/profile_update.py ] &&  # today's path: the same measurement on an earlier commit
  stage update_today "${TODAY_S:-75}" "$PY" .old/benchmarks/profile_update.py --model "$MODEL_DIR" \
    --out "$OUT/update_today.json"
stage update_profile "${PROFILE_S:-100}" "$PY" benchmarks/profile_update.py --model "$MODEL_DIR" --out "$OUT/update_new.json"
stage update_mixed "${MIXED_S:-60}" "$PY" benchmarks/profile_update.py --model "$MODEL_DIR" --rows 16 --mixed \
  --variants new,rows --profile-variant '' --out "$OUT/update_mixed.json"
cat "$OUT/stages.txt"
