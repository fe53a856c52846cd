"""What a person looks at: report.html, the before/after tables, the model card and the PNGs.
It reads results (an evaluation's records, a run's metrics.jsonl, speedrun.json) and runs nothing;
eval/ runs and measures."""
