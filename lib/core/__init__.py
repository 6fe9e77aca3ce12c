"""What every part of the pipeline shares: errors, atomic outputs, progress lines, the machine's runtime,
processes working together (torchrun, DDP, FSDP), MLflow, and the opening every stage shares."""
