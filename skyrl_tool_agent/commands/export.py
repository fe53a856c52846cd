"""Export a trained model for serving, one plain model directory: a LoRA adapter merged into its
base model, or a full-mode (ZeRO-3) checkpoint consolidated from its shards.

    skyrl-tool-agent export outputs/grpo/final --merge --output-dir outputs/grpo/merged
    skyrl-tool-agent export outputs/grpo --merge --output-dir merged      # a run directory: its final/
    skyrl-tool-agent export outputs/grpo/checkpoints/step-000040 --merge --output-dir merged
    skyrl-tool-agent export outputs/full/checkpoints/step-000040 --output-dir step40   # full mode

A full-mode run writes its consolidated model to final/ at the end only; its checkpoints hold the
ZeRO-3 shards (and the model's config.json and tokenizer), from which this command builds the same
kind of directory on request, on the CPU, without a launcher: the fp32 master weights rounded to
--dtype (bf16: the last checkpoint's export equals final/). It needs the fp32 weights in RAM
(4 bytes a parameter: ~30 GB for a 7B model).

The result (bf16 by default, tokenizer and chat template included, merged_from.json naming the
adapter and base) loads with `AutoModelForCausalLM.from_pretrained` and in any server (`vllm serve
DIR`, SGLang, `transformers serve`). The adapter itself is served from final/ as it is, on its base
(vLLM `--enable-lora --lora-modules`, peft `PeftModel.from_pretrained`, or this project's `eval
--model-path`): docs/serving.md. The merge runs in float32 on --device (cpu by default: a 1.5B
model needs ~7 GB of RAM, a 7B one ~31 GB).

A QLoRA adapter (the run's config.yaml has model.quantization.load_in_4bit: true) was trained on the
NF4-quantised base; merged, it lands on the unquantised base it never trained on, so the merged
model's outputs differ from the trained policy's by the quantisation error. The export then says so
in one `note:` line and in merged_from.json (`trained_on_4bit_base`), and the merged model should be
evaluated (`evaluate --model-path DIR`) before it is served; serving the adapter unmerged on the
4-bit base (`evaluate --model-path final/` with the run's quantization) is exactly what was trained.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from skyrl_tool_agent.commands._args import add_output_dir, new_parser
from skyrl_tool_agent.config import UserInputError, cli_main_guard


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    p = new_parser(__doc__, prog)
    p.add_argument("adapter", type=Path, help="training's final/, a run directory, or a checkpoint step-XXXXXX/ "
                   "(a full-mode one is consolidated from its ZeRO-3 shards)")
    p.add_argument("--merge", action="store_true", help="merge the adapter into its base model (required for a "
                   "LoRA adapter; the adapter itself needs no export)")
    add_output_dir(p, "where the exported model goes (a new or empty directory)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16",
                   help="dtype of the saved weights (default bfloat16)")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu", help="where the merge runs")
    p.add_argument("--base", metavar="MODEL", help="the base model (default: the one adapter_config.json names)")
    return p.parse_args(argv)


def trained_on_4bit_base(adapter: Path) -> bool:
    """Whether the run that wrote `adapter` (final/, a run directory, a checkpoint step-XXXXXX/)
    trained it on a 4-bit base: its config.yaml's model.quantization.load_in_4bit."""
    import yaml

    adapter = adapter.resolve()
    for run in (adapter, adapter.parent, adapter.parent.parent):  # run/, run/final/, run/checkpoints/step-X/
        config = run / "config.yaml"
        if config.is_file():
            try:
                model = (yaml.safe_load(config.read_text()) or {}).get("model") or {}
            except (OSError, yaml.YAMLError):
                return False
            return bool((model.get("quantization") or {}).get("load_in_4bit"))
    return False


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = parse_args(argv, prog)
    from skyrl_tool_agent.jobs.progress import setup_logging

    setup_logging()
    with cli_main_guard(also=(FileNotFoundError,)):
        from skyrl_tool_agent.distributed.checkpoint import export_consolidated, is_sharded_checkpoint

        if is_sharded_checkpoint(args.adapter):
            if not args.output_dir:
                raise UserInputError("export needs --output-dir DIR (where the consolidated model goes)")
            done = export_consolidated(args.adapter, Path(args.output_dir).expanduser(), dtype=args.dtype)
            print(f"exported {done['checkpoint']} (step {done['step']}) from its ZeRO-3 shards: {args.output_dir} "
                  f"({done['dtype']}, {done['parameters'] / 1e6:.1f}M parameters)")
            return
        if not args.merge:
            raise UserInputError("export writes the adapter merged into its base: give --merge (the adapter "
                                 "itself is served from final/ as it is: docs/serving.md)")
        if not args.output_dir:
            raise UserInputError("export --merge needs --output-dir DIR (where the merged model goes)")
        if not args.adapter.exists():
            raise UserInputError(f"{args.adapter}: no such directory")
        from skyrl_tool_agent.policy.export import export_merged

        out = Path(args.output_dir).expanduser()
        record = export_merged(args.adapter, out, dtype=args.dtype, device=args.device, base=args.base)
        if trained_on_4bit_base(args.adapter):
            merged_from = out / "merged_from.json"
            if merged_from.is_file():
                merged_from.write_text(json.dumps({**json.loads(merged_from.read_text()), "trained_on_4bit_base": True},
                                                  indent=1) + "\n")
            print(f"note: {args.adapter} is a QLoRA adapter, trained on the NF4-quantised base; merged onto the "
                  f"unquantised {record['base']} it never trained on, its outputs differ from the trained policy's: "
                  f"evaluate {out} (evaluate --model-path) before serving it, or serve the adapter unmerged on the "
                  "4-bit base")
    print(f"merged {record['adapter']} into {record['base']}: {args.output_dir} ({record['dtype']}, "
          f"{record['parameters'] / 1e6:.1f}M parameters)")
