"""``python -m amp_compiler``: the ``amp-compiler`` command."""

import sys

from amp_compiler.cli import main

sys.exit(main())
