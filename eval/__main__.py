"""``python -m bert_of.eval ...``: the evaluation commands without the rest of ``bert-of``."""

import sys

from bert_of.eval.cli import main

sys.exit(main())
