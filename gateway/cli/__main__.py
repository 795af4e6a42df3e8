"""`python -m gateway.cli ...`: the `imgw` command (the bench and the tests start the
gateway this way)."""

import sys

from gateway.cli import main

sys.exit(main())
