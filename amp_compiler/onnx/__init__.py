"""The ONNX frontend: reading, checking and writing model files, and the typed IR a conversion starts from.

``files`` reads a model file safely (``external_data`` its weights, ``validate`` and ``structure``
check it, ``deferred`` leaves large weights on disk), ``typing`` builds the typed IR (onnx's checker
and shape inference in ``native_checks``, a child process for large models), ``output`` turns the
converted IR back into a ModelProto, and ``save`` writes it atomically. Inside this package ``import
onnx`` still means the onnx package (imports are absolute).
"""
