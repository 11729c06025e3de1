"""Makes crates/brigade-serve/tests/data/bpe-tokenizer.json: a GPT-2-style byte-level BPE
tokenizer (ByteLevel pre-tokenizer and decoder, <|endoftext|>), trained with Hugging Face
`tokenizers` on README.md and docs/*.md (in file-name order) to 384 tokens. The serving tests
train a tiny model with it, so text goes through a real BPE — multi-byte characters split over
tokens included. (The checked-in file was made when all of that prose was in README.md.)

Run from the repository root with the peers' venv:
    ../shared/peers/.venv/bin/python scripts/make_test_tokenizer.py
"""
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=384,
    special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
prose = ["README.md"] + [os.path.join("docs", n) for n in sorted(os.listdir("docs")) if n.endswith(".md")]
tok.train(prose, trainer)
tok.save("crates/brigade-serve/tests/data/bpe-tokenizer.json")
print("vocabulary", tok.get_vocab_size(), "; <|endoftext|> =", tok.token_to_id("<|endoftext|>"))
