"""A permissive schema for configs/deepspeed_config.json: only the keys this project relies on are
typed, every other key passes through. Loaded on demand, by full-mode runs only.

DeepSpeed ZeRO-3 offload (off by default; for models that do not fit in GPU memory):
``zero_optimization.offload_optimizer = {"device": "cpu", "pin_memory": true}`` moves optimizer
states to CPU RAM (about 12 bytes per parameter; slower steps), ``offload_param`` the same for the
parameters themselves; ``"device": "nvme"`` with ``"nvme_path"`` spills to a fast local disk.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, PlainValidator

from skyrl_tool_agent.config.base import Section, knob

AUTO = "auto"


def _auto_or(kind: type, what: str) -> Any:
    """A type accepting the string 'auto' (filled in by accelerate) or a value of `kind`."""

    def check(value: Any) -> Any:
        if value == AUTO:
            return value
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, kind) and not (kind is not bool and isinstance(value, bool)):
            return value
        raise ValueError(f"expected {what} or 'auto', got {value!r}")

    return Annotated[Any, PlainValidator(check)]


AutoInt = _auto_or(int, "an integer")
AutoFloat = _auto_or(float, "a number")
AutoBool = _auto_or(bool, "true/false")


class Passthrough(Section):
    """A section of a foreign format: typed known keys, any other key allowed."""

    model_config = ConfigDict(extra="allow")


class OffloadConfig(Passthrough):
    """ZeRO offload target (see module doc)."""

    device: Literal["none", "cpu", "nvme"] = knob("none", "Where to offload; none = stay on GPU.")
    pin_memory: bool = knob(False, "Pinned CPU memory (faster transfers, more host RAM).")


class ZeroConfig(Passthrough):
    """`zero_optimization`: ZeRO stage and its buffers."""

    stage: Literal[0, 1, 2, 3] = knob(3, "ZeRO stage; 3 shards parameters, gradients and optimizer states.")
    offload_optimizer: OffloadConfig | None = knob(None, "Optimizer-state offload (see module doc).")
    offload_param: OffloadConfig | None = knob(None, "Parameter offload, stage 3 only (see module doc).")
    overlap_comm: bool = knob(True, "Overlap gradient reduction with backward.")
    contiguous_gradients: bool = knob(True, "Copy gradients to one buffer (less fragmentation).")
    reduce_bucket_size: AutoInt = knob(AUTO, "Elements per reduction bucket; auto = hidden_size^2.")
    stage3_gather_16bit_weights_on_model_save: bool = knob(
        True, "Gather the sharded weights into one 16-bit state dict when saving (needed for HF save)."
    )


class PrecisionFlag(Passthrough):
    """`bf16` / `fp16` section."""

    enabled: AutoBool = knob(False, "Whether this precision is on; auto = from the launcher.")


class DeepSpeedConfig(Passthrough):
    """The DeepSpeed JSON: ZeRO-3 + bf16 with 'auto' values that accelerate fills in."""

    train_micro_batch_size_per_gpu: AutoInt = knob(
        AUTO, "Per-GPU micro-batch; auto = the trainer sets training.micro_batch_size."
    )
    gradient_accumulation_steps: AutoInt = knob(AUTO, "auto = the trainer's accumulation.")
    gradient_clipping: AutoFloat = knob(AUTO, "auto = training.max_grad_norm.")
    train_batch_size: AutoInt = knob(AUTO, "auto = micro-batch x accumulation x GPUs.")
    bf16: PrecisionFlag = knob(default_factory=PrecisionFlag, description="bf16 mixed precision.")
    fp16: PrecisionFlag | None = knob(None, "fp16 mixed precision (unused on H100).")
    zero_optimization: ZeroConfig = knob(default_factory=ZeroConfig, description="ZeRO settings.")

    def check_for_mode(self, mode: str) -> list[tuple[str, str]]:
        """Problems for training.mode `mode`, as (field path, message)."""
        problems: list[tuple[str, str]] = []
        if mode == "full" and self.zero_optimization.stage != 3:
            problems.append(
                ("zero_optimization.stage", f"must be 3 for training.mode=full, got {self.zero_optimization.stage}")
            )
        if self.bf16.enabled is not True:
            problems.append(
                (
                    "bf16.enabled",
                    f"must be true, got {self.bf16.enabled!r} (accelerate takes the precision from this "
                    "file when deepspeed_config_file is used; 'auto' would mean fp32)",
                )
            )
        return problems
