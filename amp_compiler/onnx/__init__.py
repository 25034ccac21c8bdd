"""The ONNX frontend: reading, checking and typing ONNX models, and their precision graph."""
