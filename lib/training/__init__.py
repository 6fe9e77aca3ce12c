"""Training: optimizers and schedules by name, the token-budget and epoch loops, checkpoints, the finetune
variants by name (variants/), and the pretrain/adapt, finetune and distill procedures built on them."""
