"""``python -m lab``: the lab's command (:mod:`lab.cli`)."""

import sys

from .cli import main

sys.exit(main())
