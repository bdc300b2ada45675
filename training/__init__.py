"""Training side: dataset loaders, multi-task mixture, training loop, calibration."""
