"""The memory model: a Qwen2's shape (`shape`), every quantity a run holds on a device written once
(`model`), the joint plan of the rollout engine's episodes and the update's micro-batch (`plan`),
sized from a run's config (`sizing`), and the docs' table (`table`). Above config and kernels, below
the policy: the engine, the trainer, `--profile auto`, `doctor` and docs/distributed.md all call it."""
