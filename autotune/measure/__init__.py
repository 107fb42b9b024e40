"""How one booted server is measured: the workload, the streaming client, the statistics, the load ladder,
memory sampling and the trial that ties them together. Knows nothing of Optuna."""
