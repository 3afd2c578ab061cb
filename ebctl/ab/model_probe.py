"""Run in the server's Python (``python ebctl/ab/model_probe.py MODEL [SHAREGPT.json N SEED]``): the model's
vocabulary size, its tokenizer's special ids and its context length, as transformers reads them (from a local
folder or the Hugging Face cache the server loads from), and with a ShareGPT file, N (input, output) length pairs
drawn by sglang's own ``bench_serving`` loader with that tokenizer. Prints one JSON line."""

from __future__ import annotations

import json
import random
import sys


def main(argv: list[str]) -> int:
    from transformers import AutoConfig, AutoTokenizer

    model = argv[0]
    conf = AutoConfig.from_pretrained(model, trust_remote_code=True)
    text = getattr(conf, "text_config", None) or conf
    tok = AutoTokenizer.from_pretrained(model, trust_remote_code=True)
    out = {"vocab": int(getattr(text, "vocab_size", None) or len(tok)), "special": sorted(set(tok.all_special_ids)),
           "context": int(getattr(text, "max_position_embeddings", 0) or 0)}
    if len(argv) >= 4:
        import numpy as np
        from sglang.benchmark.datasets.sharegpt import sample_sharegpt_requests

        random.seed(int(argv[3]))
        np.random.seed(int(argv[3]))
        rows = sample_sharegpt_requests(dataset_path=argv[1], num_requests=int(argv[2]), tokenizer=tok)
        out["pairs"] = [[int(r.prompt_len), int(r.output_len)] for r in rows]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
