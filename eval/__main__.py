"""``python -m bert_of.eval ...``: the evaluation commands without the rest of ``bert-of``."""

import sys

import bert_of.runtime.process as process

process.setup()  # before the command's imports load native libraries

from bert_of.eval.cli import main  # noqa: E402

sys.exit(main())
