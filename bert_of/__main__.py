"""``bert-of`` and ``python -m bert_of``: the process is set up for a command before anything loads a
native library (signals, NumPy's threads: bert_of.runtime.process), then the command line runs."""

import sys

import bert_of.runtime.process as process


def main() -> int:
    process.setup()
    from bert_of.cli import main as cli_main  # after the set-up: bert_of.cli's imports load NumPy

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
