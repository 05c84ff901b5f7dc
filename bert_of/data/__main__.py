"""``python -m bert_of.data COMMAND ...`` (the same as ``bert-of data COMMAND ...``)."""

import sys

from bert_of.data.cli import main

sys.exit(main())
