"""``python -m trainsim.cli``: the `trainsim` command."""

import sys

from trainsim.cli import main

sys.exit(main())
