"""`python -m clasp`: the `clasp` command (`clasp.cli`), for where its script is not on PATH."""

import sys

from clasp.cli import main

sys.exit(main())
