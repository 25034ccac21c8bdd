"""The ONNX frontend: model files in and out, the typed IR a conversion starts from, its precision graph.

``files`` reads a model file safely (``external_data`` its weights, ``validate`` and ``structure``
check it, ``deferred`` leaves large weights on disk), ``typing`` builds the typed IR (onnx's checker
and shape inference in ``native_checks``, a child process for large models), ``precision_graph``
builds the analysis view of that IR (``slots`` and ``control_flow`` group a node's slots and tie
If/Loop/Scan bodies; ``ir_walk`` walks IR graphs, ``walk`` proto graphs), ``output`` turns the
converted IR back into a ModelProto, and ``save`` writes it atomically. Inside this package ``import
onnx`` still means the onnx package (imports are absolute).
"""
