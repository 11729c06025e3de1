"""brigade embed against sentence-transformers on sentences the tests never saw: long ones past
256 tokens, many scripts, emoji, accents, empty-looking ones (blank, spaces, zero-width,
control characters). Runs `brigade embed` on them and prints the worst cosine.

Usage: ../shared/peers/.venv/bin/python scripts/check_embed_vs_st.py [MODEL_DIR]
(needs the peers' venv: ../shared/peers/setup_venv.sh; a release build of brigade)
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from sentence_transformers import SentenceTransformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared", "models", "all-MiniLM-L6-v2")
SENTENCES = [
    "",
    "   ",
    "\u200b\u200b",
    "\x1c\x1d text between separators \x1f",
    "\u00a0non-breaking\u00a0spaces\u00a0",
    "مرحبا بالعالم، هذه جملة باللغة العربية.",
    "नमस्ते दुनिया, यह एक हिंदी वाक्य है।",
    "สวัสดีชาวโลก นี่คือประโยคภาษาไทย",
    "안녕하세요 세계, 이것은 한국어 문장입니다.",
    "こんにちは世界、これは日本語の文です。",
    "Ελληνικά: Γειά σου Κόσμε!",
    "👍👍👍 🎉🎉 🇫🇷🇯🇵 👩‍👩‍👧‍👦",
    "e\u0301 combining accents: re\u0301sume\u0301 vs résumé",
    "ＦＵＬＬＷＩＤＴＨ ｌｅｔｔｅｒｓ ａｎｄ １２３",
    "tab\tseparated\tvalues\tand\u3000ideographic space",
    "a" * 3000,
    " ".join(["supercalifragilisticexpialidocious"] * 120),
    " ".join(f"word{i}" for i in range(600)),
    "The same sentence. " * 80,
    "x",
    "?",
    "Mixed 中文 English Русский العربية 한국어 in one line.",
]


def main():
    st = SentenceTransformer(MODEL, device="cpu")
    want = st.encode(SENTENCES, batch_size=8, convert_to_numpy=True, normalize_embeddings=False)
    with tempfile.TemporaryDirectory() as d:
        inp = os.path.join(d, "in.jsonl")
        with open(inp, "w", encoding="utf-8") as f:
            for i, s in enumerate(SENTENCES):
                f.write(json.dumps({"id": i, "text": s}, ensure_ascii=False) + "\n")
        out = os.path.join(d, "out")
        subprocess.run([os.path.join(ROOT, "target", "release", "brigade"), "embed", "--model", MODEL,
                        "--input", inp, "--output", out, "--workers", "1"], check=True, stdout=subprocess.DEVNULL)
        got = np.load(os.path.join(out, "shard-00000.npy"))
        ids = [int(x) for x in open(os.path.join(out, "shard-00000.ids"))]
    assert ids == list(range(len(SENTENCES))), ids
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    worst = int(cos.argmin())
    print(json.dumps({"sentences": len(SENTENCES), "min_cosine": float(cos.min()), "worst": SENTENCES[worst][:60],
                      "max_abs_diff": float(np.abs(got - want).max())}, ensure_ascii=False))
    if cos.min() < 0.99999:
        sys.exit(f"cosine {cos.min()} below 0.99999 on {SENTENCES[worst][:60]!r}")


if __name__ == "__main__":
    main()
