"""The test-model catalog: hand-built rule graphs, public architectures, wheel-shipped models."""
