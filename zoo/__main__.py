"""``python -m zoo ...`` = ``bert-of zoo ...``."""

import sys

from zoo.cli import main

sys.exit(main(sys.argv[1:]))
