//! `brigade embed`'s readers on arbitrary bytes: the corpus scan (as JSONL and as plain text,
//! skip and fail) must return documents or an error, never panic, and the shards must hold
//! exactly the documents the scan counted; `.npy` parsing and `--verify` of a directory whose
//! manifest is these bytes must not panic either.
#![no_main]
use brigade::embed::corpus::{read_shard, scan, Format, InputSpec, OnError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("brigade-fuzz-embed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("input");
    std::fs::write(&file, data).unwrap();
    for format in [Format::Jsonl, Format::Text] {
        for on_error in [OnError::Skip, OnError::Fail] {
            let spec = InputSpec {
                files: vec![file.clone()],
                format: Some(format),
                id_field: "id".into(),
                text_field: "text".into(),
                on_error,
            };
            for size in [1, 3] {
                if let Ok(index) = scan(&spec, size) {
                    let got: usize = index.shards.iter().map(|s| read_shard(&spec, &index, s).unwrap().len()).sum();
                    assert_eq!(got as u64, index.documents);
                }
            }
        }
    }
    let _ = brigade::embed::npy::read(data);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("manifest.json"), data).unwrap();
    let _ = brigade::embed::output::verify(&out);
});
