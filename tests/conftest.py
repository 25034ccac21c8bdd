import os
import sys
from pathlib import Path

# The model catalog lives in models/ at the repository root and is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Every analysis in the tests checks each pass's requires/ensures (amp_compiler.pipeline), child
# processes (the CLI tests) included.
os.environ.setdefault("AMP_COMPILER_CHECK_PASSES", "1")
