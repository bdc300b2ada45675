"""The command layer: the ``dialogue-safety`` console entry point and the workflows that cross stages (fix-it)."""
