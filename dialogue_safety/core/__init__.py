"""The model contract every stage shares: schema, encoding, scoring, model directory and card, batching budget,
the torch-free ONNX runtime and its variants, explanations. Imports nothing else of the project, never torch."""
