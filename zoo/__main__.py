"""``python -m bert_of.zoo ...`` = ``bert-of zoo ...``."""

import sys

from bert_of.zoo.cli import main

sys.exit(main(sys.argv[1:]))
