"""Data in: sources, the data stage's raw copies, cleaning and deduplication, the tokenizer, packed tokens, windows."""
