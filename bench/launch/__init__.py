"""Starting a run: its plan (plan), the checks before it (preflight), the launchers
(launchers), their output read for root causes (output), Slurm (slurm), the run's life from
record to exit (run) and what it prints (summary)."""
