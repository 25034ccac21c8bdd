"""Trained models that ship inside PyPI wheels."""
