"""`python -m tfaccel doctor` is `tfaccel doctor`."""

import sys

from tfaccel.cli import main

sys.exit(main())
