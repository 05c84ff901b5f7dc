"""transformers' side of bench/tokenizer_parity.py (runs in the anchor environment).

    python bench/tokenizer_parity_anchor.py FOLDER DO_LOWER_CASE IN.json OUT.json
"""

import json
import sys
import time

from transformers import BertTokenizerFast


def main() -> None:
    folder, lower, src, dst = sys.argv[1], sys.argv[2] == "True", sys.argv[3], sys.argv[4]
    spec = json.load(open(src))
    lines, calls = spec["lines"], spec["calls"]
    tok = BertTokenizerFast(vocab_file=f"{folder}/vocab.txt", do_lower_case=lower)
    out = {}
    t0 = time.perf_counter()
    e = tok(lines, **calls["singles"])
    out["singles"] = {k: e[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    out["singles"]["offset_mapping"] = [[list(o) for o in row] for row in e["offset_mapping"]]
    out["singles"]["word_ids"] = [e.word_ids(i) for i in range(len(lines))]
    e = tok(lines[:-1], lines[1:], **calls["pairs"])
    out["pairs"] = {k: e[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    out["seconds"] = time.perf_counter() - t0
    json.dump(out, open(dst, "w"))


if __name__ == "__main__":
    main()
