import sys

from clasp.cli import main

sys.exit(main())
