"""The Optuna side: the trial record, the one tell, storage, the search space, samplers, the budget,
re-measurement and the loop."""
