"""``python -m bert_of.data COMMAND ...`` (the same as ``bert-of data COMMAND ...``)."""

import sys

import bert_of.runtime.process as process

process.setup()  # before the command's imports load native libraries

from bert_of.data.cli import main  # noqa: E402

sys.exit(main())
