"""``python -m bert_of.zoo ...`` = ``bert-of zoo ...``."""

import sys

import bert_of.runtime.process as process

process.setup()  # before the command's imports load native libraries

from bert_of.zoo.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
