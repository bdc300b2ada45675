"""The ``dialogue-safety`` console entry point."""
