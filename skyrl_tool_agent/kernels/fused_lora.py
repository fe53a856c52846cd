"""LoRA projections as one matmul in the update: `x @ (W + s B A)^T` instead of peft's five ops.

While the adapter's dropout is off (the policy trains in eval mode), peft's
`base(x) + lora_B(lora_A(x)) * s` is one matmul with the merged weight `W + s B A`, built once per
forward. `LoraLinearFunction`'s backward gives the input `g @ (W + s B A)` and the adapters their
exact gradients, `dB = s g^T (x A^T)` and `dA = s (g B)^T x`; the frozen base weight gets none.

Only float32 weights are merged: in bfloat16 the small `s B A` would mostly round away against
`W`. Anything else (a bf16/fp16 or 4-bit base, dropout on, several or variant adapters, a merged
or disabled adapter, autocast) keeps peft's forward.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["LoraLinearFunction", "fused_lora", "fusable"]


class LoraLinearFunction(torch.autograd.Function):
    """`x @ (weight + scaling * lora_b @ lora_a)^T + bias`, gradients for `x`, `lora_a`, `lora_b`."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, lora_a: Tensor, lora_b: Tensor,  # type: ignore[override]
                scaling: float) -> Tensor:
        merged = torch.addmm(weight, lora_b, lora_a, alpha=scaling)
        ctx.save_for_backward(x, merged, lora_a, lora_b)
        ctx.scaling = scaling
        return torch.nn.functional.linear(x, merged, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None, None, Tensor | None, Tensor | None, None]:  # type: ignore[override]
        x, merged, lora_a, lora_b = ctx.saved_tensors
        s = ctx.scaling
        need_x, need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[3], ctx.needs_input_grad[4]
        grad_x = grad @ merged if need_x else None
        flat_x, flat_g = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        grad_a = torch.mm((flat_g @ lora_b).T, flat_x).mul_(s) if need_a else None  # (g B)^T x: [r, in]
        grad_b = torch.mm(flat_g.T, flat_x @ lora_a.T).mul_(s) if need_b else None  # g^T (x A^T): [out, r]
        return grad_x, None, None, grad_a, grad_b, None


def fusable(module: torch.nn.Module) -> bool:
    """Whether `module` is a peft `lora.Linear` whose forward `LoraLinearFunction` computes exactly: one
    active vanilla adapter, not merged nor disabled, dropout off, float32 base and adapter weights,
    no autocast."""
    base = getattr(module, "base_layer", None)
    active = getattr(module, "active_adapters", None)
    if type(base) is not torch.nn.Linear or not isinstance(active, list) or len(active) != 1:
        return False
    name = active[0]
    if (getattr(module, "disable_adapters", True) or getattr(module, "merged", True)
            or name in getattr(module, "lora_variant", {}) or name not in module.lora_A):
        return False
    dropout = module.lora_dropout[name]
    if isinstance(dropout, torch.nn.Dropout) and dropout.training and dropout.p > 0:
        return False
    a, b = module.lora_A[name], module.lora_B[name]
    if any(hasattr(t, "ds_id") for t in (base.weight, a.weight, b.weight)):  # ZeRO-3: gathered by hooks
        return False
    if type(a) is not torch.nn.Linear or type(b) is not torch.nn.Linear or a.bias is not None or b.bias is not None:
        return False
    return all(t.dtype == torch.float32 for t in (base.weight, a.weight, b.weight))


def _fused_forward(self: Any, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """A `lora.Linear.forward` that takes the one-matmul path while `fusable` (checked per call:
    a module may be switched between passes) and peft's otherwise."""
    if args or kwargs or not fusable(self) or torch.is_autocast_enabled(x.device.type) or x.dtype != torch.float32:
        return type(self).forward(self, x, *args, **kwargs)
    name = self.active_adapters[0]
    base = self.base_layer
    return LoraLinearFunction.apply(x, base.weight, base.bias, self.lora_A[name].weight, self.lora_B[name].weight,
                                    float(self.scaling[name]))


@contextlib.contextmanager
def fused_lora(model: torch.nn.Module, enabled: bool = True) -> Iterator[int]:
    """While inside, every fusable LoRA projection of `model` runs as one matmul (`LoraLinearFunction`);
    yields how many projections were switched. Leaves the modules as they were on exit."""
    switched = [m for m in model.modules() if enabled and fusable(m)]
    for module in switched:
        module.forward = types.MethodType(_fused_forward, module)
    try:
        yield len(switched)
    finally:
        for module in switched:
            del module.forward
