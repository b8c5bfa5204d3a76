"""What runs models: loading them, the process group, DDP/FSDP wrapping, precision, the
weighted training loop, checkpoints, generation."""
