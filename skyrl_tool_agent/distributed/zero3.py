"""ZeRO-3 model side of full mode: the resolved DeepSpeed config, the sharded model (and frozen
reference), and `DeepSpeedPolicy`, a `QwenPolicy` whose forwards run through a DeepSpeed engine.

`HfDeepSpeedConfig` is created before `from_pretrained` (so each rank materialises only its shard)
and the policy holds it for the whole run (transformers keeps only a weak reference).

Sampling does not go through the sharded model: each rank gathers a snapshot once per optimizer
step (`prepare_sampling`) and samples alone.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from skyrl_tool_agent.config import Config, DeepSpeedConfig, UserInputError
from skyrl_tool_agent.distributed.comm import DistContext
from skyrl_tool_agent.policy.loading import ModelLoadError, from_pretrained, load_tokenizer, resolve_model_path
from skyrl_tool_agent.policy.checkpointing import recompute_activations
from skyrl_tool_agent.memory.device import format_bytes
from skyrl_tool_agent.policy.weights import SamplingWeights
from skyrl_tool_agent.policy.prefix import plain_forward_logprobs
from skyrl_tool_agent.policy.qwen import QwenPolicy

logger = logging.getLogger(__name__)

AUTO = "auto"


# ---------------------------------------------------------------------------- config
def resolve_deepspeed_config(ds: DeepSpeedConfig | dict[str, Any], config: Config, *, hidden_size: int,
                             world_size: int) -> dict[str, Any]:
    """The DeepSpeed JSON as a dict with every 'auto' filled in.

    Batch keys come from the training config (`Config.deepspeed_auto_values`); ZeRO bucket sizes
    from the model width, with the values transformers' Trainer uses (hidden^2, 0.9 hidden^2,
    10 hidden). An 'auto' left anywhere else is a user error naming the key.
    """
    raw = ds.model_dump(mode="json", exclude_none=True) if isinstance(ds, DeepSpeedConfig) else copy.deepcopy(ds)
    for key, value in config.deepspeed_auto_values().items():
        if raw.get(key, AUTO) == AUTO:
            raw[key] = value
    if raw.get("train_batch_size", AUTO) == AUTO:
        raw["train_batch_size"] = raw["train_micro_batch_size_per_gpu"] * raw["gradient_accumulation_steps"] * world_size
    zero = raw.setdefault("zero_optimization", {})
    for key, value in {
        "reduce_bucket_size": hidden_size * hidden_size,
        "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "stage3_param_persistence_threshold": 10 * hidden_size,
    }.items():
        if zero.get(key) == AUTO:
            zero[key] = value
    left = _auto_keys(raw)
    if left:
        raise UserInputError(f"deepspeed config: no value for 'auto' at {', '.join(left)}; set a number in the JSON")
    return raw


def _auto_keys(node: Any, path: str = "") -> list[str]:
    if isinstance(node, dict):
        return [k for key, value in node.items() for k in _auto_keys(value, f"{path}.{key}" if path else key)]
    return [path] if node == AUTO else []


def model_dtype(ds_config: dict[str, Any]) -> torch.dtype:
    """The parameter dtype the DeepSpeed config trains in (bf16 in this project's JSON)."""
    if ds_config.get("bf16", {}).get("enabled") is True:
        return torch.bfloat16
    if ds_config.get("fp16", {}).get("enabled") is True:
        return torch.float16
    return torch.float32


# ---------------------------------------------------------------------------- policy
class DeepSpeedPolicy(QwenPolicy):
    """A `QwenPolicy` over a ZeRO-3 sharded model (full mode). Until `attach_engine` the model is
    the bare sharded module; training forwards are one plain pass through the DeepSpeed engine, so
    every rank runs the same number of engine forwards per micro-batch.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, ctx: DistContext,
                 hf_ds_config: Any, reference: Any = None, gradient_checkpointing: bool = False,
                 engine_memory_fraction: float | None = None) -> None:
        super().__init__(model, tokenizer, mode="full", engine_memory_fraction=engine_memory_fraction)
        self.ctx = ctx
        self.hf_ds_config = hf_ds_config  # keeps transformers' ZeRO-3 switch alive (module doc)
        self.reference_engine = reference
        self.engine: Any = None
        self.gradient_checkpointing = gradient_checkpointing
        self._snapshot_step: int | None = None  # the optimizer step the snapshot holds
    def attach_engine(self, engine: Any) -> None:
        """Route forwards through the DeepSpeed engine wrapping `self.model`."""
        self.engine = engine
        self.model = engine
        engine.eval()

    # -------------------------------------------------------------- sampling
    def prepare_sampling(self) -> None:
        """Collective (every rank, before each collection): the engine's snapshot gathered layer by
        layer and copied in place, when the optimizer has stepped since it was taken."""
        step = int(getattr(self.engine, "global_steps", 0) or 0)
        if self._weights is None:
            self._weights = SamplingWeights(self.model)
            logger.info("full mode: the rollout engine samples from a gathered %s snapshot of %s",
                        self._weights.dtype, format_bytes(self._weights.nbytes()))
        elif step != self._snapshot_step:
            self._weights.refresh_()
        self._snapshot_step = step

    def sampling_weights(self) -> SamplingWeights:
        if self._weights is None:
            raise RuntimeError("full mode samples from a gathered snapshot: call prepare_sampling() on every rank first")
        return self._weights

    # -------------------------------------------------------------- training
    def token_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
        score_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`QwenPolicy.token_logprobs` from one engine forward (`prefix.plain_forward_logprobs`)."""
        with recompute_activations(self.model, self.gradient_checkpointing and torch.is_grad_enabled()):
            return plain_forward_logprobs(self.model, input_ids, attention_mask, temperature=temperature,
                                          with_entropy=with_entropy, score_mask=score_mask)

    @contextlib.contextmanager
    def reference(self) -> Iterator[Any]:
        """The frozen initial model, itself ZeRO-3 sharded (an inference-only DeepSpeed engine)."""
        if self.reference_engine is None:
            raise RuntimeError("no reference model: it is built only when grpo.kl_coef > 0")
        yield self.reference_engine

    @torch.no_grad()
    def reference_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0,
        score_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Log-probs of `input_ids[:, 1:]` under the frozen reference ([B, L-1]; `score_mask` and the
        chunked head as in `token_logprobs`)."""
        with self.reference() as ref:
            return plain_forward_logprobs(ref, input_ids, attention_mask, temperature=temperature,
                                          score_mask=score_mask)[0]

    # ---------------------------------------------------------------- export
    def save(self, path: str | Path) -> None:
        """Consolidated 16-bit `save_pretrained` export + tokenizer. Collective: every rank calls it
        (the shards are gathered layer by layer); rank 0 writes."""
        if self.engine is None:
            raise RuntimeError("save() needs the DeepSpeed engine (attach_engine)")
        state = self.engine._zero3_consolidated_16bit_state_dict()  # None on ranks other than 0
        if self.ctx.is_main:
            path = Path(path)
            path.mkdir(parents=True, exist_ok=True)
            self.engine.module.save_pretrained(path, state_dict=state, safe_serialization=True)
            self.tokenizer.save_pretrained(path)
        self.ctx.barrier()

    def save_model_files(self, path: str | Path) -> None:
        """The model's config.json (and generation config) and the tokenizer, no weights: what a
        checkpoint keeps beside its shards so that `export` can build the model from them alone.
        Not collective (rank 0 calls it)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        module = self.engine.module if self.engine is not None else self.model
        module.config.save_pretrained(path)
        if getattr(module, "generation_config", None) is not None:
            module.generation_config.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


# ---------------------------------------------------------------------------- building
def model_hidden_size(config: Config) -> int:
    """`hidden_size` of the configured model (sizes the ZeRO buckets), read from its config.json."""
    from transformers import AutoConfig

    path = resolve_model_path(config.model)
    try:
        model_config = AutoConfig.from_pretrained(path, revision=config.model.revision,
                                                 trust_remote_code=config.model.trust_remote_code)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load model config from {path!r}: {type(exc).__name__}: {exc}") from exc
    return int(model_config.hidden_size)


def build_deepspeed_policy(config: Config, ctx: DistContext, ds_config: dict[str, Any]) -> DeepSpeedPolicy:
    """Tokenizer, ZeRO-3 sharded policy model and (when grpo.kl_coef > 0) the frozen reference.

    The policy's engine is attached by `DistributedGRPOTrainer` once the optimizer exists.
    """
    import deepspeed
    from transformers.integrations import HfDeepSpeedConfig

    if ds_config.get("zero_optimization", {}).get("stage") != 3:
        raise UserInputError("full mode under a distributed launcher needs zero_optimization.stage 3")
    path = resolve_model_path(config.model)
    tokenizer = load_tokenizer(path, config.model)
    hf_ds_config = HfDeepSpeedConfig(ds_config)  # before from_pretrained (module doc)
    dtype = model_dtype(ds_config)
    model = from_pretrained(path, config.model, dtype)
    if config.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    reference = None
    if config.grpo.kl_coef > 0:
        ref_model = from_pretrained(path, config.model, dtype).requires_grad_(False)
        ref_config = {k: v for k, v in ds_config.items() if k not in ("optimizer", "scheduler")}
        reference, *_ = deepspeed.initialize(model=ref_model, config=ref_config)
        reference.eval()
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    logger.info("full mode: %.1fM parameters, ZeRO-3 over %d ranks, %s, reference: %s", n_params / 1e6,
                ctx.world_size, dtype, "sharded copy" if reference is not None else "none (kl_coef 0)")
    return DeepSpeedPolicy(model, tokenizer, ctx=ctx, hf_ds_config=hf_ds_config, reference=reference,
                           gradient_checkpointing=config.model.gradient_checkpointing,
                           engine_memory_fraction=config.model.engine_memory_fraction)
