"""Training side: recipes, multi-task mixture, training loop, calibration, checkpoints."""
