"""``python -m amp_compiler.cli``: the ``amp-compiler`` command."""

import sys

from amp_compiler.cli.app import main

sys.exit(main())
