"""Which device and dtype a model runs on: torch alone, so a launch's ranks can join their process
group and agree on the launch before transformers and the policy are imported."""

from __future__ import annotations

import os

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(device: str) -> torch.device:
    """`auto` = cuda > mps > cpu. Under a distributed launcher, cuda uses LOCAL_RANK."""
    if device == "auto":
        if torch.cuda.is_available():
            device = "cuda"
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            device = "mps"
        else:
            device = "cpu"
    if device == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` = bf16 on CUDA, fp32 elsewhere (CPU bf16 matmuls are slow and MPS bf16 is partial)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]
