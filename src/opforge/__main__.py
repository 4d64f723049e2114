"""``python -m opforge ...`` is the ``opforge`` console script."""
import sys

from .cli import main

sys.exit(main())
