"""``python -m bert_of.align ...``: the align command alone."""

import sys

import bert_of.runtime.process as process

process.setup()  # before the command's imports load native libraries

from bert_of.align.cli import main  # noqa: E402

sys.exit(main())
