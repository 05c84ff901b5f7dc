"""``python -m bert_of.align ...``: the align command alone."""

import sys

from bert_of.align.cli import main

sys.exit(main())
