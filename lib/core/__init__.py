"""What every part of the pipeline shares: errors, atomic outputs, progress lines, the machine's runtime, MLflow."""
