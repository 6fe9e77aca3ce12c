"""params.yaml -> typed, validated dataclasses, once, at stage start; the error a user can fix (errors.py)."""
