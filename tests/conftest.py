import sys
from pathlib import Path

# The model catalog lives in models/ at the repository root and is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
