"""Our GRPO loss against TRL's own `GRPOTrainer._compute_loss`, number for number.

TRL's loss is not a free function: it is a method that first runs the model to get per-token
log-probs. So the test builds a `GRPOTrainer` without `__init__` (no model, no dataset), sets the
attributes `_compute_loss` reads exactly as `GRPOTrainer.__init__` sets them from a real
`trl.GRPOConfig`, and feeds the model's part -- `_get_per_token_logps_and_entropies` -- the same
log-probs and entropies we use. Everything after that, the loss itself, is TRL's code.

Pairs compared (clip-higher eps 0.2 / 0.28 and the k3 KL with beta 0.04 throughout):
TRL ``grpo`` = our ``sequence_mean``, ``dr_grpo`` = ``fixed_length`` (normaliser
max_completion_length), ``dapo`` = ``token_mean``. Deliberate differences are shown at the end
(README, "GRPO loss and TRL").
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_tool_agent.grpo.losses import grpo_loss

trl = pytest.importorskip("trl", reason="TRL is in the dev extra")
from accelerate import Accelerator  # noqa: E402 - after the skip: TRL brings accelerate
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402

EPS_LOW, EPS_HIGH, BETA = 0.2, 0.28, 0.04
MAX_COMPLETION = 12
PAIRS = [("grpo", "sequence_mean"), ("dr_grpo", "fixed_length"), ("dapo", "token_mean")]


def _inputs(seed: int = 0, lengths: tuple[int, ...] = (12, 5, 9, 1)) -> dict[str, torch.Tensor]:
    """Completion-only tensors [B, T] in float64: log-probs far enough from the old ones that both
    clip sides are hit, advantages of both signs, right-padded completions of unequal length."""
    gen = torch.Generator().manual_seed(seed)
    rows, width = len(lengths), MAX_COMPLETION
    logp = -torch.rand(rows, width, generator=gen, dtype=torch.float64) * 3 - 0.05
    old = logp + 0.4 * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(width)] for n in lengths], dtype=torch.float64)
    adv = torch.tensor([1.3, -0.7, 0.4, -1.1, 0.9, -0.2][:rows], dtype=torch.float64)
    entropy = torch.rand(rows, width, generator=gen, dtype=torch.float64) * 2
    return {"logp": logp, "old": old, "ref": ref, "mask": mask, "adv": adv, "entropy": entropy}


def _trl_trainer(tmp_path: Path, loss_type: str, **config: Any) -> GRPOTrainer:
    """A GRPOTrainer whose `_compute_loss` runs as after `__init__` with this `trl.GRPOConfig`."""
    args = trl.GRPOConfig(**{
        "output_dir": str(tmp_path), "use_cpu": True, "report_to": [], "loss_type": loss_type, "beta": BETA,
        "epsilon": EPS_LOW, "epsilon_high": EPS_HIGH, "max_completion_length": MAX_COMPLETION,
        "use_bias_correction_kl": False, "per_device_train_batch_size": 4, "num_generations": 4, **config,
    })
    trainer = GRPOTrainer.__new__(GRPOTrainer)
    trainer.args = args
    # What GRPOTrainer.__init__ sets from `args` (trl 1.16 grpo_trainer.py, the lines noted).
    trainer.max_completion_length = args.max_completion_length  # 782
    trainer.use_vllm = args.use_vllm  # 811
    trainer.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction  # 815
    trainer.loss_type = args.loss_type  # 819
    trainer.aux_loss_enabled = False  # 832: no router (not a mixture-of-experts model)
    trainer.importance_sampling_level = args.importance_sampling_level  # 834
    trainer.off_policy_mask_threshold = args.off_policy_mask_threshold  # 835
    trainer.top_entropy_quantile = args.top_entropy_quantile  # 845
    trainer.entropy_coef = args.entropy_coef  # 846
    trainer.use_adaptive_entropy = args.use_adaptive_entropy  # 847
    trainer._entropy_bonus_enabled = trainer.entropy_coef != 0.0 or trainer.use_adaptive_entropy  # 850
    trainer.epsilon_low = args.epsilon  # 945
    trainer.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon  # 946
    trainer.beta = args.beta  # 983
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}  # 1080
    trainer.accelerator = Accelerator(cpu=True)  # one process
    trainer.current_gradient_accumulation_steps = 1  # transformers.Trainer: no accumulation
    trainer.model = torch.nn.Module()  # only `.training` is read (True: the train-mode branch)
    return trainer


def trl_loss(trainer: GRPOTrainer, x: dict[str, torch.Tensor], logp: torch.Tensor) -> torch.Tensor:
    """TRL's `_compute_loss` on our tensors; `logp` is what the model forward would return."""
    rows, width = logp.shape
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logp, x["entropy"], None)
    inputs = {
        "prompt_ids": torch.zeros(rows, 0, dtype=torch.long), "prompt_mask": torch.zeros(rows, 0, dtype=torch.long),
        "completion_ids": torch.zeros(rows, width, dtype=torch.long), "completion_mask": x["mask"],
        "advantages": x["adv"], "old_per_token_logps": x["old"], "ref_per_token_logps": x["ref"],
        "num_items_in_batch": x["mask"].sum(),  # dapo: tokens in the generation batch (= this batch here)
    }
    return trainer._compute_loss(trainer.model, inputs)


def our_loss(x: dict[str, torch.Tensor], logp: torch.Tensor, aggregation: str, entropy_coef: float = 0.0) -> torch.Tensor:
    loss, _ = grpo_loss(
        logp, x["old"], x["adv"], x["mask"].bool(), ref_logp=x["ref"], kl_coef=BETA, kl_estimator="k3",
        entropy=x["entropy"], entropy_coef=entropy_coef, eps_low=EPS_LOW, eps_high=EPS_HIGH,
        aggregation=aggregation, fixed_length=MAX_COMPLETION,  # type: ignore[arg-type]
    )
    return loss


def loss_and_grad(fn: Any, x: dict[str, torch.Tensor]) -> tuple[float, torch.Tensor]:
    logp = x["logp"].clone().requires_grad_(True)
    loss = fn(logp)
    (grad,) = torch.autograd.grad(loss, logp)
    return float(loss), grad


@pytest.mark.parametrize(("loss_type", "aggregation"), PAIRS)
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_and_gradient_equal_trl(tmp_path: Path, loss_type: str, aggregation: str, seed: int) -> None:
    x = _inputs(seed)
    trainer = _trl_trainer(tmp_path, loss_type)
    theirs, their_grad = loss_and_grad(lambda lp: trl_loss(trainer, x, lp), x)
    ours, our_grad = loss_and_grad(lambda lp: our_loss(x, lp, aggregation), x)
    assert ours == pytest.approx(theirs, abs=1e-6, rel=0)
    torch.testing.assert_close(our_grad, their_grad, atol=1e-6, rtol=0)
    # the case is not trivial: both clip sides are active and KL contributes
    ratio = torch.exp(x["logp"] - x["old"])
    on = x["mask"].bool()
    assert bool(((ratio > 1 + EPS_HIGH) & (x["adv"][:, None] > 0) & on).any())
    assert bool(((ratio < 1 - EPS_LOW) & (x["adv"][:, None] < 0) & on).any())
    assert trainer._metrics["train"]["kl"][-1] > 0


# ------------------------------------------------------------------ deliberate differences (README)


def test_difference_kl_is_not_multiplied_by_the_ratio(tmp_path: Path) -> None:
    """TRL's default use_bias_correction_kl=True multiplies the k3 term by pi/pi_old; ours is plain
    k3, as in DeepSeekMath (the parity above sets the flag off). On-policy (ratio 1) the two losses
    agree in value; off-policy they differ."""
    x = _inputs()
    corrected = _trl_trainer(tmp_path, "dapo", use_bias_correction_kl=True)
    theirs, _ = loss_and_grad(lambda lp: trl_loss(corrected, x, lp), x)
    ours, _ = loss_and_grad(lambda lp: our_loss(x, lp, "token_mean"), x)
    assert abs(ours - theirs) > 1e-4
    on_policy = {**x, "old": x["logp"].clone()}
    theirs, _ = loss_and_grad(lambda lp: trl_loss(corrected, on_policy, lp), on_policy)
    ours, _ = loss_and_grad(lambda lp: our_loss(on_policy, lp, "token_mean"), on_policy)
    assert ours == pytest.approx(theirs, abs=1e-9)


def test_difference_sequence_mean_skips_sequences_without_policy_tokens(tmp_path: Path) -> None:
    """TRL grpo averages over every row, so a row with no completion tokens dilutes the loss; our
    sequence_mean counts only sequences with a policy token (the loss does not depend on a filler
    row). Without such a row they agree (above)."""
    x = _inputs(lengths=(12, 5, 9, 0))
    trainer = _trl_trainer(tmp_path, "grpo")
    theirs, _ = loss_and_grad(lambda lp: trl_loss(trainer, x, lp), x)
    ours, _ = loss_and_grad(lambda lp: our_loss(x, lp, "sequence_mean"), x)
    assert ours == pytest.approx(theirs * 4 / 3, abs=1e-9)


def test_difference_entropy_bonus_is_aggregated_like_the_policy_term(tmp_path: Path) -> None:
    """TRL adds the entropy bonus as a token mean whatever the loss type; ours goes through the same
    aggregation as the policy term (one normaliser, so gradient accumulation stays exact). Equal for
    dapo / token_mean, different for grpo / sequence_mean."""
    x = _inputs()
    coef = 0.05
    for loss_type, aggregation, same in [("dapo", "token_mean", True), ("grpo", "sequence_mean", False)]:
        trainer = _trl_trainer(tmp_path, loss_type, entropy_coef=coef)
        theirs, _ = loss_and_grad(lambda lp: trl_loss(trainer, x, lp), x)
        ours, _ = loss_and_grad(lambda lp: our_loss(x, lp, aggregation, entropy_coef=coef), x)
        assert (abs(ours - theirs) < 1e-6) is same, (loss_type, ours, theirs)
