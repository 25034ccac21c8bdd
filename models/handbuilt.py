"""Hand-built graphs, one per precision rule."""
