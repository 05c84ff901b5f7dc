"""Files and directories that readers never see half-written; every write in bert_of goes here.

One module per job:

- ``atomic``: a file appears whole or not at all (``atomic_write``, ``atomic_open``, ``write_json``),
  append-safe JSON lines (``append_jsonl``, ``read_jsonl``, ``filter_jsonl``), one-line write errors
  (``writes_to``), and the unfinished writes a process abandons when it must end at once.
- ``reading``: ``read_json`` (one line per failure), ``sha256_file``.
- ``home``: where bert_of keeps its stores (``bert_of_home``) and the time its records carry (``utc_now``).
- ``locks``: one writer per directory (``locked``, ``check_unlocked``), naming the holder.
- ``owned``: which files are bert_of's (names each layer registers, the files manifest) and the rules every
  destination obeys (``check_destination``).
- ``publish``: a directory built in a staging folder and swapped in by one rename (``publishing``,
  ``publishing_into``).
- ``pinned``: ``PinnedDir``, several files read from one tree while the path may be swapped.
"""
