"""``python -m eval ...``: the evaluation commands without the rest of ``bert-of``."""

import sys

from eval.cli import main

sys.exit(main())
