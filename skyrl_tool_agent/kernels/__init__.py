"""Fused tensor operations the policy runs (`logprobs`, `fused_lora`, `decode_attention`), each with
its reference arithmetic beside it, and the CPU threads they run on (`cpu_threads`). They know
nothing of models, configs or episodes."""
