"""Training: optimizer and schedules, the token-budget and epoch loops, checkpoints, and the
pretrain/adapt, finetune and distill procedures built on them."""
