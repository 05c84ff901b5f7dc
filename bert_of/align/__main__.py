"""``python -m bert_of.align ...``: the align command alone, or a worker (``worker BATCH.json RESULTS_DIR``)."""

import sys

from bert_of.align.cli import main

sys.exit(main())
