"""Proof on a real GPU: one command that measures amp-compiler's outputs against FP32 and the peers.

    python -m benchmarks.gpu [--provider cuda|tensorrt|cpu] [--models a,b] [--variants ...]
                             [--parts onnx,tensorrt,fx] [--quick] --out DIR [--results benchmarks/RESULTS.md]
                             [--resume] [--workdir DIR] [--deadline-min M]

Per model (the catalog's BERT-base, GPT-2, ViT-B/16, ResNet-50, Whisper-tiny encoder, T5-small
encoder and decoder at full size with random weights, the deployment catalog's fused BERT and GPT-2
and its onnxruntime-genai FP32 decoder; ``--quick``: their reduced ``-small`` versions), every
variant (:mod:`benchmarks.gpu.variants`: FP32; amp-compiler FP16, BF16 and calibrated FP8 for the
provider; onnxconverter-common; onnxruntime's own ``--float16`` tooling; ModelOpt AutoCast where it
imports) on onnxruntime's provider (:mod:`benchmarks.gpu.measure`): latency median and p90 at batch
1 and 8 with I/O bound on the device, device memory, the nodes that fell back to the CPU (shape
arithmetic listed apart), accuracy against FP32 on the same device next to amp-compiler's CPU
emulator's figure. ``tensorrt`` part: a strongly typed TensorRT engine of each variant's file and
weak typing's FP16 flag on the FP32 model, where the ``tensorrt`` module imports
(:mod:`benchmarks.gpu.tensorrt`). ``fx`` part: training steps of ``prepare_training`` against
``torch.autocast`` + ``GradScaler`` and inference of ``ampfx.convert`` and ``ampfx.compile`` against
autocast, FP16 and BF16, on ResNet-50 and BERT-base (:mod:`benchmarks.gpu.fx`).

Every (part, model, variant) is one row of ``DIR/gpu.json`` (:mod:`benchmarks.gpu.rows`), measured
in a worker process (:mod:`benchmarks.gpu.runner`): a variant that fails, crashes its process or runs
past its time is a row saying so, and the run goes on. ``DIR/gpu.md`` is the Markdown report, with
the device, driver, CUDA, versions and the exact command; both are rewritten after every row, so a
run stopped early keeps what it measured, and ``--resume`` measures only the rows still missing.
``--results FILE`` puts the Markdown between ``<!-- gpu:begin -->`` and ``<!-- gpu:end -->`` in FILE.

``--provider cpu --quick`` runs the same code on a CPU in a couple of minutes (a CI smoke test does:
``tests/e2e/test_benchmark_smoke.py``); its numbers say nothing about GPUs. On the lent GPU machine,
``benchmarks/gpu_setup.py`` brings onnxruntime-gpu and the other packages over and starts the run
(``docs/gpu-benchmarks.md`` gives the device calls in order).
"""
