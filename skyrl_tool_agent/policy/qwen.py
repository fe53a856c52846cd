"""`QwenPolicy`: token-in/token-out sampling and log-probs for a Qwen2-architecture model.

The collector keeps the exact ids this policy sampled and the log-probs of those ids under the
sampling distribution (temperature-scaled, before top-p truncation, which is what the trainer's
importance ratio compares against). The trainer recomputes log-probs on the same ids with
`token_logprobs`; nothing is ever re-tokenised from text.

Every mode samples through one engine, `engine.RolloutEngine`, on CPU and CUDA alike, from a
`weights.SamplingWeights` snapshot; `model.generate` runs only for an architecture the engine does
not implement (`weights.unsupported_reason`), and the log says so.

Dropout is off in both sampling and training forwards (the model stays in eval mode; gradients
still flow): with dropout on, the ratio of a fully on-policy update would not be 1.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from skyrl_tool_agent.config import ModelConfig
from skyrl_tool_agent.kernels.logprobs import token_logprobs
from skyrl_tool_agent.memory.plan import RunPlan
from skyrl_tool_agent.policy.engine import RolloutEngine
from skyrl_tool_agent.policy.device import resolve_device
from skyrl_tool_agent.policy.loading import check_4bit_training_layout, load_model, load_tokenizer, resolve_model_path
from skyrl_tool_agent.policy.prefix import batch_logprobs
from skyrl_tool_agent.policy.sampling_params import SamplingParams, logprob_temperature
from skyrl_tool_agent.policy.weights import SamplingWeights, unsupported_reason

logger = logging.getLogger(__name__)


@dataclass
class Generation:
    """One sampled continuation: exact ids and their sampling log-probs."""

    token_ids: list[int]
    logprobs: list[float]


class QwenPolicy:
    """A causal LM + tokenizer pair with batched sampling and training-time log-probs."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, mode: str = "lora",
                 engine_memory_fraction: float | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.mode = mode
        self.device = next(model.parameters()).device
        self.stop_token_ids = self._stop_ids(tokenizer)
        self._reference: PreTrainedModel | None = None
        self.is_4bit = any(getattr(p, "quant_state", None) is not None for p in model.parameters())
        self._weights: SamplingWeights | None = None
        self._engine: RolloutEngine | None = None
        self.engine_memory_fraction = engine_memory_fraction  # `model.engine_memory_fraction` (None: its default)
        # What the run's memory plan chose (`use_plan`): the memory left free for the update, whether
        # to sample through the model's modules (None: a 4-bit model does), the prefill chunk.
        self.update_reserve_bytes = 0
        self.sample_through_modules: bool | None = None
        self.prefill_tokens: int | None = None
        #: Why the engine cannot sample this model (None: it does).
        self.engine_blocker: str | None = unsupported_reason(model)
        if self.engine_blocker:
            logger.warning("the rollout engine cannot run this model (%s): sampling through model.generate, "
                           "which keeps no cache between turns and is slower", self.engine_blocker)
        self.model.eval()

    @classmethod
    def from_config(cls, config: ModelConfig, *, mode: str = "lora") -> QwenPolicy:
        """Load from `config.name_or_path` (hub name, local path, or the embedded default)."""
        path = resolve_model_path(config)
        device = resolve_device(config.device)
        tokenizer = load_tokenizer(path, config)
        model = load_model(path, config, device, mode=mode)
        return cls(model, tokenizer, mode=mode, engine_memory_fraction=config.engine_memory_fraction)

    @staticmethod
    def _stop_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
        ids = []
        for token in ("<|im_end|>", "<|endoftext|>"):
            tid = tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
                ids.append(tid)
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
            ids.append(tokenizer.eos_token_id)
        return ids

    # -------------------------------------------------------------- sampling
    def sampler(self) -> str:
        """What samples, for logs and records: 'engine', or 'model.generate (why)'."""
        return "engine" if self.engine_blocker is None else f"model.generate ({self.engine_blocker})"

    def use_plan(self, plan: RunPlan) -> None:
        """Sample as the run's memory plan says (before the engine is built)."""
        self.update_reserve_bytes = int(plan.parts["update"])
        self.sample_through_modules = plan.through_modules
        self.prefill_tokens = plan.prefill_tokens

    def sampling_weights(self) -> SamplingWeights:
        """The engine's weight snapshot, taken on first use: through the model's modules or a folded
        copy as `sample_through_modules` says; unset, a 4-bit model goes through its modules and a
        LoRA model's adapters are folded in."""
        if self._weights is None:
            through = self.is_4bit if self.sample_through_modules is None else self.sample_through_modules
            logger.info("the rollout engine samples %s", "through the model's modules, the adapters beside the "
                        "base weights" if through else "from a copy with the adapters folded in")
            self._weights = SamplingWeights(self.model, through_modules=through)
        return self._weights

    def prepare_sampling(self) -> None:
        """Called by every rank before a collection: nothing to do here (the engine refreshes the
        snapshot itself); a sharded policy gathers its weights now, together."""

    def rollout_engine(self, *, slots: int, capacity: int) -> RolloutEngine | None:
        """The engine for `slots` episodes of up to `capacity` tokens (None when it cannot run this
        model), kept for the run; rebuilt only when asked for more slots or longer episodes."""
        if self.engine_blocker is not None:
            return None
        engine = self._engine
        if engine is None or engine.demand < slots or engine.max_tokens < capacity:
            if engine is not None:
                logger.info("rollout engine rebuilt for %d slots of %d tokens (it had %d of %d)", slots, capacity,
                            engine.demand, engine.max_tokens)
            self.release_rollout_engine()
            self._engine = RolloutEngine(self.sampling_weights(), slots=slots, capacity=capacity,
                                         stop_ids=self.stop_token_ids, pad_id=self.tokenizer.pad_token_id,
                                         memory_fraction=self.engine_memory_fraction,
                                         reserved_bytes=self.update_reserve_bytes, prefill_tokens=self.prefill_tokens)
        return self._engine

    def engine_stats(self) -> dict[str, float]:
        """The rollout engine's counters (its slots, episodes that waited for one and the seconds they
        waited, ...); empty before it is built or where it cannot run."""
        engine = self._engine
        return {} if engine is None else {**engine.stats, "slots": engine.slots}

    def release_rollout_engine(self) -> None:
        """Free the engine's KV cache and graphs (the snapshot stays)."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *, max_new_tokens: int,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        """Sample one continuation of up to `max_new_tokens` per prompt through the engine, each
        prompt's tokens drawn from its seed (`seeds`, default: from the caller's torch RNG); where
        the engine cannot run the model, `model.generate` samples from the torch RNG."""
        if not prompts:
            return []
        engine = self.rollout_engine(slots=len(prompts), capacity=max(map(len, prompts)) + max_new_tokens)
        if engine is None:
            return self._hf_generate(prompts, params, max_new_tokens)
        if seeds is None:
            seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()
        results = engine.generate(prompts, params, max_new_tokens=max_new_tokens, seeds=seeds)
        return [Generation(i, lp) for i, lp, _ in results]

    def _hf_generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                     max_new_tokens: int) -> list[Generation]:
        """`model.generate` on a left-padded batch: the fallback for models the engine cannot run,
        and the tests' reference."""
        batch = self.tokenizer.pad({"input_ids": [list(p) for p in prompts]}, padding_side="left", return_tensors="pt")
        width = batch["input_ids"].shape[1]
        greedy = params.greedy
        out = self.model.generate(
            **batch.to(self.device), max_new_tokens=max_new_tokens, do_sample=not greedy,
            temperature=None if greedy else params.temperature, top_p=None if greedy else params.top_p, top_k=None,
            eos_token_id=self.stop_token_ids, pad_token_id=self.tokenizer.pad_token_id,
            return_dict_in_generate=True, output_logits=True,
        )
        new_ids = out.sequences[:, width:].cpu()
        temperature = logprob_temperature(params.temperature)
        logits = torch.stack(out.logits, dim=1).float().cpu()  # [B, T, V], raw (before warping)
        logprobs = token_logprobs(logits, new_ids.clamp(min=0), temperature)
        results = []
        for ids, row_logprobs in zip(new_ids.tolist(), logprobs.tolist()):
            end = next((j + 1 for j, t in enumerate(ids) if t in self.stop_token_ids), None)
            results.append(Generation(ids[:end], row_logprobs[:end]))
        return results

    # -------------------------------------------------------------- training
    def token_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
        score_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of `input_ids[:, 1:]` given the prefix, shape [B, L-1] (and entropy if asked).

        Right-padded batches; position t of the output scores token t+1. Rows sharing a long
        prefix (the system prompt) run it once (see `policy.prefix`). `score_mask` ([B, L-1]): the
        positions wanted; the others score 0 and cost no head projection.
        """
        if self.is_4bit and torch.is_grad_enabled():
            check_4bit_training_layout(self.model)
        return batch_logprobs(self.model, input_ids, attention_mask, temperature=temperature, with_entropy=with_entropy,
                              score_mask=score_mask)

    @contextlib.contextmanager
    def training_precision(self) -> Iterator[None]:
        """The update's forwards and backwards in the weights' dtype: a bf16/fp16 model's float32
        LoRA adapters run their matmuls in the model's dtype under autocast (they and their
        gradients stay float32). Wrap backward passes too (checkpointed layers recompute there)."""
        dtype = next(self.model.parameters()).dtype
        adapters = [p for n, p in self.model.named_parameters() if "lora_" in n and p.requires_grad]
        if dtype not in (torch.bfloat16, torch.float16) or not adapters or self.is_4bit:
            yield
            return
        from peft.helpers import disable_input_dtype_casting

        with torch.autocast(self.device.type, dtype=dtype), disable_input_dtype_casting(self.model):
            yield

    @contextlib.contextmanager
    def reference(self) -> Iterator[PreTrainedModel]:
        """The reference policy for the KL term: LoRA = the same weights with adapters disabled
        (no second copy in memory); full = a frozen copy made on first use."""
        if self.mode == "lora" and hasattr(self.model, "disable_adapter"):
            with self.model.disable_adapter():
                yield self.model
            return
        if self._reference is None:
            self._reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        yield self._reference

    @torch.no_grad()
    def reference_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0,
                           score_mask: torch.Tensor | None = None) -> torch.Tensor:
        with self.reference() as ref:
            return batch_logprobs(ref, input_ids, attention_mask, temperature=temperature, score_mask=score_mask)[0]

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def save(self, path: str | Path) -> None:
        """`save_pretrained` of the adapter (LoRA) or the whole model (full), plus the tokenizer."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
