"""Graph passes, installed as ``amp_compiler.passes``, in one folder per contract.

- :mod:`amp_compiler.passes.analysis`: analysis passes (:class:`~amp_compiler.passes.analysis.base.AnalysisPass`).
  They read a :class:`~amp_compiler.core.graph.PrecisionGraph` and write a
  :class:`~amp_compiler.core.plan.PrecisionPlan`, never the model, and check what they guarantee in
  ``ensures``. Framework-neutral: both frontends run them, in the order
  :mod:`amp_compiler.passes.analysis.pipeline` gives.
- :mod:`amp_compiler.passes.onnx`: ONNX model passes (onnx_ir's contract, ``call(model) -> PassResult``).
  They apply a plan to an ``onnx_ir`` model: lowering, cleanup, Tensor Core padding, FP8 Q/DQ.

This package imports neither, so that importing one contract's passes does not load the other's.
"""
