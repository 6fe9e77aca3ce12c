"""params.yaml -> typed, validated dataclasses, once, at stage start."""
