"""Makes crates/brigade-cli/tests/fixtures/parquet/: Parquet files written by pyarrow, as the
corpora users download are (Hugging Face datasets, FineWeb), for tests/tokenize.rs:

- docs.parquet: 7 rows in row groups of 3 (snappy, pyarrow's default), a `text` string column
  beside an `id` integer column; row 4 (1-based) is null.
- docs_zstd.parquet: the same rows without the null, zstd-compressed, one row group.
- texts.json: each file's texts, in row order (null as null).

Run from the repository root with the peers' venv (pyarrow installed into it):
    target/peers-venv/.venv/bin/pip install pyarrow
    target/peers-venv/.venv/bin/python scripts/make_parquet_fixtures.py
"""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

OUT = "crates/brigade-cli/tests/fixtures/parquet"
os.makedirs(OUT, exist_ok=True)
texts = ["The first row.", "Naïve 東京 🙂 text,\nover two lines.", "", None, "Shard boundaries cross row groups.",
         "  spaced  ", "The last row."]
pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), f"{OUT}/docs.parquet", row_group_size=3)
kept = [t for t in texts if t is not None]
pq.write_table(pa.table({"text": kept}), f"{OUT}/docs_zstd.parquet", compression="zstd")
json.dump({"docs.parquet": texts, "docs_zstd.parquet": kept}, open(f"{OUT}/texts.json", "w"), ensure_ascii=False)
print("wrote", sorted(os.listdir(OUT)))
