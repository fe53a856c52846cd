#!/usr/bin/env bash
# The GPU update issue's measurements in one device call (carry [".whl", ".old"]; command
# `bash scripts/gpu_update.sh`), each stage under its own time limit, logs and JSON in $OUT:
#   today   benchmarks/profile_update.py of the commit before the update changes (a `git archive` of it
#           in .old: `git archive 7306197 skyrl_tool_agent benchmarks | tar -x -C .old`), 8 x 6,144 tokens
#   new     this code's profile_update.py on the same micro-batch: new, casts, logits, no_ckpt variants
#   mixed   16 rows of lengths 768..6,144: passes by token budget vs by row count
#   step    the gpu profile's worst-case step (16 tasks x 16 episodes, 8 turns x 512 tokens, every group
#           kept), rollout/update/total seconds and peak memory from metrics.jsonl
# Random bf16 weights with Qwen2.5-1.5B's shape (.whl/make_qwen_shape.py): times, not learning.
set -u
OUT=${OUT:-/tmp/gpu_update}
mkdir -p "$OUT"
source .whl/on_gpu.sh > "$OUT/stages.txt" 2>&1 || { cat "$OUT/stages.txt"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$OUT/stages.txt"
python3 .whl/make_qwen_shape.py /tmp/q15 >> "$OUT/stages.txt" 2>&1
STAGES=${STAGES:-today new mixed step}
stage() {
  local name=$1 limit=$2 start rc
  shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  start=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/stages.txt"
}
stage today "${TODAY_S:-75}" python3 .old/benchmarks/profile_update.py --model /tmp/q15 --out "$OUT/update_today.json"
stage new "${NEW_S:-90}" python3 benchmarks/profile_update.py --model /tmp/q15 --out "$OUT/update_new.json"
stage mixed "${MIXED_S:-60}" python3 benchmarks/profile_update.py --model /tmp/q15 --rows 16 --mixed \
  --variants new,rows --profile-variant '' --out "$OUT/update_mixed.json"
stage step "${STEP_S:-200}" python3 training/scripts/train_grpo.py --mode lora --profile gpu \
  --set model.name_or_path=/tmp/q15 --set training.max_steps=1 --set training.time_budget_minutes=null \
  --set grpo.batcher.enabled=false --set grpo.filter_uniform_groups=false --set training.checkpoint_every=0 \
  --set training.eval_num_tasks=1 --set training.eval_samples=0 --set training.probe_tasks=0 --output-dir /tmp/run_lora
grep -h '"time/' /tmp/run_lora/metrics.jsonl > "$OUT/step_metrics.jsonl" 2>/dev/null
python3 - "$OUT" <<'PY' | tee -a "$OUT/stages.txt"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for name in ("update_today", "update_new", "update_mixed"):
    f = out / f"{name}.json"
    if f.exists():
        d = json.loads(f.read_text())
        rows = d.get("variants") or {k: v for k, v in d.items() if isinstance(v, dict) and "seconds" in v}
        print(name, d.get("gpu"), json.dumps(rows), json.dumps(d.get("kernel_share", {})))
for line in (out / "step_metrics.jsonl").read_text().splitlines() if (out / "step_metrics.jsonl").exists() else []:
    m = json.loads(line)
    print("step", {k: m.get(k) for k in ("time/rollout_s", "time/update_s", "memory/gpu_peak_gib", "policy_tokens", "tokens_per_s")})
PY
