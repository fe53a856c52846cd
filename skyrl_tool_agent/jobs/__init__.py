"""One file per job (train, the GRPO and SFT arms, the speedrun, model builds, evaluate, doctor), each
opening its run with `jobs.run.open_run`; the commands parse arguments and call these."""
