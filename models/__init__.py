"""The test-model catalog: hand-built rule graphs, public architectures, deployment graphs, wheel-shipped models."""
