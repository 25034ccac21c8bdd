"""Public architectures built from transformers configs with random weights."""
