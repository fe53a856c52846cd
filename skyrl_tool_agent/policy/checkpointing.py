"""Gradient checkpointing that really applies while the policy trains in eval mode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def recompute_activations(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Train mode with every dropout off, while `enabled`: transformers recomputes activations only
    in train mode, and the update's log-probs must match the sampler's (no dropout).
    """
    if not enabled:
        yield
        return
    was_training = model.training
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.eval()
    try:
        yield
    finally:
        model.train(was_training)


def recomputing(model: torch.nn.Module) -> bool:
    """Whether `model`'s forward recomputes activations now: a layer with gradient checkpointing
    on, in train mode. Such layers drop any KV cache (transformers' `GradientCheckpointingLayer`),
    so cache-based shortcuts (the shared-prefix forward) must not be taken."""
    return model.training and any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
