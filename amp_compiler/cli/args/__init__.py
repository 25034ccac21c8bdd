"""Argument groups: each owns a set of options, reads them back, and does the work they ask for.

In the spirit of Polygraphy's ``tools/args``: a command is made of groups, and a group that needs
another one's result says so in its constructor or its methods' parameters.

- :class:`~amp_compiler.cli.args.model_file.ModelFileArgs`: the input model and the output model
  path (load safely, check the output path once, save atomically); depends on nothing.
- :class:`~amp_compiler.cli.args.conversion.ConversionArgs`: what to convert to (``ConvertOptions``)
  and ``--input-shape``; checking the shapes' names needs the loaded model.
- :class:`~amp_compiler.cli.args.analysis.AnalysisArgs`: ``--calibration-data``, ``--tolerance``, the
  analysis path; depends on ``ConversionArgs``.
- :mod:`~amp_compiler.cli.args.report`: where and how a precision report is written; needs an analysis.
"""
