"""Shared code of the transfer-learning pipeline; the scripts in stages/ are thin wrappers over it."""
