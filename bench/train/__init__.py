"""One rank's side of a run: its entry (rank), the Trainer and its step, the build of model
and optimizer, the schedule, the verify driver, the reference loop, the scratch folder
the launcher reads, the MLPerf log."""
