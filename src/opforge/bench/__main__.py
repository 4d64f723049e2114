"""``python -m opforge.bench ...``: the same as ``opforge bench ...``."""

import sys

from opforge.bench.cli import main

sys.exit(main())
