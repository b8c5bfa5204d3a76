"""Algorithms on arrays and tensors: selection, allocation, clustering, projection, feature
extractors, per-sample LoRA gradients, InfoBatch, dynamic draws, the time model, losses.
No file I/O and no config: each function takes the values it needs."""
