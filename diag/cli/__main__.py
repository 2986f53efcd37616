"""`python -m diag.cli ...` is `diag ...`."""

import sys

from diag.cli.main import main

sys.exit(main())
