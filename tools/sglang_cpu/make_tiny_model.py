"""Build a tiny random Llama model + character-level tokenizer that the real sglang can serve on CPU.

    python tools/sglang_cpu/make_tiny_model.py DIR [--dtype bfloat16|float32] [--seed 0]

Test infrastructure: no model can be downloaded on the project's machines, so tests make one. 2 layers,
hidden 64, intermediate 128, 4 attention heads, 2 KV heads, vocabulary 512, seeded random weights
(the text it writes is noise; only shapes and timings matter). The tokenizer maps one character to one
token (4 special tokens + 508 characters = 512, the model's vocabulary, so every id the model emits
decodes). Idempotent: does nothing when DIR/config.json exists. Built in a sibling temporary directory
and renamed, so a half-written DIR is never seen. Runs inside the sglang venv (torch, transformers,
tokenizers). See docs/sglang-cpu.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

VOCAB_SIZE = 512
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _characters(n: int) -> list[str]:
    """n distinct single characters: printable ASCII, tab and newline first, then Latin-1 onwards."""
    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    code = 0xA1
    while len(chars) < n:
        ch = chr(code)
        if ch.isprintable() and not ch.isspace():
            chars.append(ch)
        code += 1
    return chars[:n]


def build_tokenizer(out: Path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + _characters(VOCAB_SIZE - len(SPECIALS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one char each
    tok.decoder = decoders.Fuse()  # join characters back without spaces
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, *, dtype: str, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    config.dtype = dtype  # what sglang loads the weights as (transformers 5 name; was torch_dtype)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(out, safe_serialization=True)


def make_tiny_model(directory: str | os.PathLike, *, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Create the tiny model in `directory` unless it already holds one; return the directory."""
    out = Path(directory)
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        build_model(tmp, dtype=dtype, seed=seed)
        build_tokenizer(tmp)
        tmp.chmod(0o755)  # mkdtemp made it 0700
        if out.exists() and not any(out.iterdir()):
            out.rmdir()
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").exists():  # someone else won the race: fine; else fail
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(make_tiny_model(args.dir, dtype=args.dtype, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
