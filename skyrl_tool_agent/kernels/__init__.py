"""Fused tensor operations the policy runs, each a pure function (or autograd function) over
tensors with its reference arithmetic beside it: per-token log-probs without full-vocabulary
float32 copies (`logprobs`), a LoRA projection as one matmul in the update (`fused_lora`), and
the rollout engine's attention over a slot cache with a shared root (`decode_attention`); and the
CPU threads they run on, freed by a thread that goes idle (`cpu_threads`). They know nothing of
models, configs or episodes (as Liger's kernels stand apart from TRL)."""
