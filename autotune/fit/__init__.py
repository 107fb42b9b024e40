"""Whether a configuration fits in memory before anything boots: the card, the model's shape, the estimate,
the corrections learnt from a study's boots, and the memory cap."""
