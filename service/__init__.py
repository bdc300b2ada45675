"""Torch-free serving side: schema, encoding, runtime, batcher, HTTP API."""
