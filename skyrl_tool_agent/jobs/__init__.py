"""One file per job (train, the GRPO and SFT arms, the speedrun, model builds, evaluate, doctor, the
memory profile), each opening its run with `jobs.run.open_run` (the memory profile opens none); the
commands parse arguments and call these."""
