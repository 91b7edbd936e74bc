"""``python -m serving_opt.samples``: see serving_opt.samples.cli."""

import sys

from serving_opt.samples.cli import main

sys.exit(main())
