//! GGUF reading against llama.cpp's own files: each tensor type's blocks as `llama-quantize
//! --pure` wrote them from the real SmolLM2-135M-Instruct, dequantized bit for bit as gguf-py's
//! reference does (`tests/fixtures/gguf_blocks.json`, made by `scripts/make_gguf_fixture.py`).

mod common;

use brigade::models::gguf::quants::GgmlType;
use serde_json::Value;

fn fixture() -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf_blocks.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// One cache of unpacked GGUF metadata for the whole test binary: its tests run as threads of one
/// process and `BRIGADE_CACHE` is the process's, so each test pointing it at its own folder
/// raced (one test's second lookup read another's folder, or a folder already deleted).
fn one_cache() {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        std::env::set_var("BRIGADE_CACHE", d.path());
        d
    });
}

/// The writer's quantizers on the values llama-quantize started from: its bytes exactly.
#[test]
fn the_writers_blocks_are_llama_quantizes_bytes() {
    let f = fixture();
    for name in ["Q8_0", "Q4_0", "Q5_0", "Q4_K"] {
        let t = &f["types"][name];
        let ty = GgmlType::from_id(t["id"].as_u64().unwrap() as u32).unwrap();
        let source: Vec<f32> =
            t["source_bits"].as_array().unwrap().iter().map(|v| f32::from_bits(v.as_u64().unwrap() as u32)).collect();
        assert_eq!(source.len(), 6 * ty.block().0);
        let ours = ty.encode(&source);
        let want = hex(t["bytes"].as_str().unwrap());
        let differ = ours.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!((ours.len(), differ), (want.len(), 0), "{name}: bytes differ from llama-quantize's");
    }
}

/// The writer's quantizers on values off any grid (Gaussian rows, outliers, one-signed rows, a
/// constant and a zero block, tiny and huge magnitudes): llama.cpp's `ggml_quantize_chunk`
/// bytes exactly (`tests/fixtures/gguf_quantize.json`, `scripts/make_quant_fixture.sh`) — here
/// Q4_K's weighted fit and its search over scales decide every level.
#[test]
fn the_writers_blocks_are_llama_cpps_off_the_grid() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf_quantize.json");
    let f: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let source: Vec<f32> =
        f["source_bits"].as_array().unwrap().iter().map(|v| f32::from_bits(v.as_u64().unwrap() as u32)).collect();
    let (rows, k) = (f["rows"].as_u64().unwrap() as usize, f["k"].as_u64().unwrap() as usize);
    assert_eq!(source.len(), rows * k);
    let types = f["types"].as_object().unwrap();
    assert_eq!(types.len(), 4, "Q8_0, Q4_0, Q5_0, Q4_K");
    for (name, bytes) in types {
        let ty = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_K]
            .into_iter()
            .find(|t| t.name() == name.to_uppercase())
            .unwrap_or_else(|| panic!("{name}: not a type the writer encodes"));
        let want = hex(bytes.as_str().unwrap());
        let (_, bb) = ty.block();
        let per_row = ty.bytes(k);
        for r in 0..rows {
            let ours = ty.encode(&source[r * k..(r + 1) * k]);
            let theirs = &want[r * per_row..(r + 1) * per_row];
            let first = ours.iter().zip(theirs).position(|(a, b)| a != b);
            assert_eq!(
                first,
                None,
                "{name} row {r}: byte {:?} (block {:?}) differs from llama.cpp's",
                first,
                first.map(|i| i / bb)
            );
        }
    }
}

/// A Q4_0 or Q8_0 matrix of a GGUF file served with `--weights int4` or `int8` runs on the
/// file's own values: quantizing the dequantized blocks again gives them back bit for bit
/// (Q4_0's largest value sits at level 0, so its scale is recovered exactly; Q8_0's at ±127).
#[test]
fn q4_0_and_q8_0_weights_quantize_back_to_the_files_values() {
    use brigade::tensor::rowwise::Packed;
    let f = fixture();
    for name in ["Q4_0", "Q8_0"] {
        let t = &f["types"][name];
        let deq: Vec<f32> =
            t["values_bits"].as_array().unwrap().iter().map(|v| f32::from_bits(v.as_u64().unwrap() as u32)).collect();
        // one output column whose 192 inputs are the file's six blocks (groups of 32 along k)
        let (k, n) = (deq.len(), 1);
        let packed = Packed::new(&deq, k, n);
        let q = if name == "Q4_0" { packed.quantized_int4() } else { packed.quantized_int8(32) };
        let back = q.dequantized();
        let differ = back.iter().zip(&deq).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{name}: {differ} of {k} values changed");
    }
}

#[test]
fn every_type_dequantizes_bit_for_bit_as_gguf_py() {
    let f = fixture();
    let types = f["types"].as_object().unwrap();
    let want = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"];
    assert_eq!(types.keys().map(String::as_str).collect::<Vec<_>>(), want, "every type but F32 is in the fixture");
    for (name, t) in types {
        let ty = GgmlType::from_id(t["id"].as_u64().unwrap() as u32).unwrap();
        assert_eq!(ty.name(), name);
        let bytes = hex(t["bytes"].as_str().unwrap());
        let (per, size) = ty.block();
        assert_eq!(bytes.len() % size, 0, "{name}: whole blocks");
        let mut got = Vec::new();
        ty.dequantize_into(&bytes, &mut got);
        let bits: Vec<u32> = t["values_bits"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(got.len(), bytes.len() / size * per, "{name}");
        assert_eq!(got.len(), bits.len(), "{name}");
        for (i, (g, w)) in got.iter().zip(&bits).enumerate() {
            assert_eq!(g.to_bits(), *w, "{name} value {i}: {g} against gguf-py's {}", f32::from_bits(*w));
        }
    }
}

/// Every block type kept as stored (`GgmlType::quant_rows` → `Packed::from_quant_rows`): the
/// rows' values are gguf-py's dequantization bit for bit, and the quantized kernels' product —
/// at every tile shape (8-, 4- and single-row tiles, several strips, a ragged last strip) — is
/// bit for bit the f32 kernel's on those values, so serving a file as stored is serving its
/// dequantized weights, batch-invariant.
#[test]
fn every_block_type_kept_as_stored_computes_the_dequantized_product() {
    use brigade::tensor::rowwise::{matmul_rows, Packed};
    let f = fixture();
    let mut kept = 0;
    for (name, t) in f["types"].as_object().unwrap() {
        let ty = GgmlType::from_id(t["id"].as_u64().unwrap() as u32).unwrap();
        let bytes = hex(t["bytes"].as_str().unwrap());
        let (per, size) = ty.block();
        let blocks = bytes.len() / size;
        // rows of k = 2 blocks' values, 37 rows cycling through the file's blocks (3 strips,
        // the last one ragged)
        let (k, rows) = (2 * per, 37);
        let mut data = Vec::new();
        for r in 0..rows {
            for b in 0..2 {
                let at = (r * 2 + b + r / 3) % blocks;
                data.extend_from_slice(&bytes[at * size..(at + 1) * size]);
            }
        }
        let Some(q) = ty.quant_rows(&data, rows, k) else {
            assert!(["F16", "BF16"].contains(&name.as_str()), "{name} is a block type and must be kept as stored");
            continue;
        };
        let mut deq = Vec::new();
        ty.dequantize_into(&data, &mut deq);
        let vals = q.dequantized();
        assert_eq!(vals.len(), deq.len());
        let differ = vals.iter().zip(&deq).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{name}: {differ} of the rows' values differ from the dequantized ones");
        // the f32 kernel on the dequantized matrix [k, rows] (row r is output column r)
        let mut w = vec![0f32; k * rows];
        for r in 0..rows {
            for kk in 0..k {
                w[kk * rows + r] = deq[r * k + kk];
            }
        }
        let (f32s, stored) = (Packed::new(&w, k, rows), Packed::from_quant_rows(&q));
        assert!(stored.bytes() < f32s.bytes() / 3, "{name}: held quantized ({} bytes)", stored.bytes());
        for m in [1, 3, 4, 8, 13] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919 % 997) as f32 / 498.5 - 1.0) * 0.3).collect();
            let (mut want, mut got) = (vec![0f32; m * rows], vec![0f32; m * rows]);
            matmul_rows(&mut want, &a, &f32s, m);
            matmul_rows(&mut got, &a, &stored, m);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{name}, {m} rows, element {i}: {g} against {w}");
            }
        }
        kept += 1;
    }
    assert_eq!(kept, 8, "the eight block types");
}

/// Matrices of different types reading one input (a fused q|k|v of a Q4_K_M file: Q4_K,
/// Q4_K, Q6_K) share one form that holds each exactly.
#[test]
fn mixed_types_fused_into_one_product_keep_every_value() {
    use brigade::tensor::quant_rows::QuantRows;
    use brigade::tensor::rowwise::{matmul_rows, Packed};
    let f = fixture();
    let rows_of = |name: &str, rows: usize| {
        let t = &f["types"][name];
        let ty = GgmlType::from_id(t["id"].as_u64().unwrap() as u32).unwrap();
        let bytes = hex(t["bytes"].as_str().unwrap());
        let size = ty.block().1;
        let per_row = 256 / ty.block().0;
        let data: Vec<u8> =
            (0..rows * per_row).flat_map(|i| bytes[(i % (bytes.len() / size)) * size..][..size].to_vec()).collect();
        ty.quant_rows(&data, rows, 256).unwrap()
    };
    for parts in
        [vec!["Q4_K", "Q4_K", "Q6_K"], vec!["Q4_0", "Q4_1"], vec!["Q4_0", "Q4_0"], vec!["Q8_0", "Q5_1", "Q4_K"]]
    {
        let qs: Vec<QuantRows> = parts.iter().enumerate().map(|(i, n)| rows_of(n, 5 + 3 * i)).collect();
        let deq: Vec<f32> = qs.iter().flat_map(|q| q.dequantized()).collect();
        let fused = QuantRows::concat(qs);
        let (k, n) = (fused.k, fused.rows);
        // equal values (a zero minimum turns −0 into +0, which no fma chain from +0 tells apart)
        let differ = fused.dequantized().iter().zip(&deq).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{parts:?}: {differ} values changed");
        let mut w = vec![0f32; k * n];
        for r in 0..n {
            for kk in 0..k {
                w[kk * n + r] = deq[r * k + kk];
            }
        }
        let a: Vec<f32> = (0..9 * k).map(|i| ((i * 31 % 101) as f32 - 50.0) / 97.0).collect();
        let (mut want, mut got) = (vec![0f32; 9 * n], vec![0f32; 9 * n]);
        matmul_rows(&mut want, &a, &Packed::new(&w, k, n), 9);
        matmul_rows(&mut got, &a, &Packed::from_quant_rows(&fused), 9);
        assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "{parts:?}");
    }
}

/// The real SmolLM2-135M-Instruct GGUF (Q4_1 weights, Q8_0 embeddings) beside the Hugging Face
/// folder transformers' own GGUF loader made from it (`get.sh --hf`): the same config, every
/// parameter bit for bit, the same chat template, the same token ids. Needs the files
/// `../shared/models/smollm2-135m-instruct/get.sh DIR --hf` writes, at `$BRIGADE_SMOLLM2`
/// (`.ci/run` sets it after fetching them); skipped, saying so, without it.
#[test]
fn the_real_smollm2_gguf_reads_as_transformers_dequantized_it() {
    let Some(dir) = std::env::var_os("BRIGADE_SMOLLM2").map(std::path::PathBuf::from) else {
        eprintln!("skipped: set BRIGADE_SMOLLM2 to the folder get.sh --hf filled (.ci/run does)");
        return;
    };
    let gguf = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let hf = dir.join("hf");
    use brigade::models::open::{metadata_folder, open_config, open_model};
    assert_eq!(format!("{:?}", open_config(&gguf).unwrap()), format!("{:?}", open_config(&hf).unwrap()));
    let (m1, p1) = open_model(&gguf).unwrap();
    let (m2, p2) = brigade::models::checkpoint::load_model(&hf).unwrap();
    assert_eq!(m1.layout.total, m2.layout.total);
    for s in &m2.layout.specs {
        let (a, b) = (s.view.of(&p1), s.view.of(&p2));
        let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        assert_eq!(differ, 0, "{}: {differ} of {} values differ from transformers' dequantization", s.name, a.len());
    }
    // the tokenizer and template unpacked from the metadata
    let meta = metadata_folder(&gguf).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(meta.join("tokenizer_config.json")).unwrap()).unwrap();
    let template = std::fs::read_to_string(hf.join("chat_template.jinja")).unwrap();
    assert_eq!(cfg["chat_template"].as_str().unwrap().trim_end(), template.trim_end());
    assert_eq!((cfg["bos_token"].as_str(), cfg["eos_token"].as_str()), (Some("<|im_start|>"), Some("<|im_end|>")));
    let ours = brigade::models::tokenizer::Tokenizer::from_file(&meta).unwrap();
    let theirs = brigade::models::tokenizer::Tokenizer::from_file(&hf).unwrap();
    assert_eq!(ours.vocab_size(), theirs.vocab_size());
    let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/shakespeare");
    let mut text = String::new();
    if let Ok(rd) = std::fs::read_dir(&shared) {
        let mut files: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files.iter().take(3) {
            text.push_str(&std::fs::read_to_string(f).unwrap_or_default().chars().take(20_000).collect::<String>());
        }
    }
    text.push_str("<|im_start|>user\nWhat's the weather like?<|im_end|>\n<|im_start|>assistant\n ünïcödé ✓ 🦙");
    // transformers' loader makes a plain GPT-2 pre-tokenizer of 'smollm'; llama.cpp (and the
    // published SmolLM2 tokenizer) split digits one by one: compared where there are none
    let text: String = text.chars().filter(|c| !c.is_numeric()).collect();
    assert_eq!(ours.encode(&text).unwrap(), theirs.encode(&text).unwrap());
    let digits = ours.encode("in 2024").unwrap();
    let pieces: Vec<String> = digits.iter().map(|&i| ours.decode(&[i])).collect();
    assert_eq!(pieces, ["in", " ", "2", "0", "2", "4"], "each digit alone");
}

/// A checkpoint folder of `cfg` with random weights (distinct everywhere, so a misplaced row
/// shows) and the shared tokenizer folder `tok`.
fn checkpoint(dir: &std::path::Path, cfg: brigade::models::GptConfig, tok: &std::path::Path) -> Vec<f32> {
    use brigade::models::checkpoint::{hf_config, save_tensors, write_json};
    std::fs::create_dir_all(dir).unwrap();
    let model = brigade::models::Gpt::new(cfg).unwrap();
    let mut params = model.layout.init(5);
    for (i, p) in params.iter_mut().enumerate() {
        *p += (i % 977) as f32 * 1e-4;
    }
    save_tensors(&dir.join("model.safetensors"), &model.layout, &params, "", None).unwrap();
    write_json(&dir.join("config.json"), &hf_config(&cfg)).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tok.join(f), dir.join(f)).unwrap();
    }
    params
}

/// brigade's own f32 export of each family member read back: the same config, every parameter
/// bit for bit (the Llama architecture's q/k rows back from llama.cpp's pair order, Qwen2's
/// biases, Llama 3's rope scaling from its factors), the same token ids from the tokenizer
/// rebuilt out of the metadata as from the original `tokenizer.json`, the same template.
#[test]
fn brigades_own_gguf_reads_back_as_the_checkpoint_it_was() {
    use brigade::models::family::Family;
    use brigade::models::open::{metadata_folder, open_config, open_model};
    let tmp = tempfile::tempdir().unwrap();
    one_cache();
    let Family::Llama(with_all) = Family::ALL[1] else { panic!("the second family is Llama's") };
    // Qwen2: q/k/v biases, no o bias, no scaling; Llama 3: biases everywhere and scaled rope
    let qwen = brigade::models::family::Llama { o_bias: false, rope_scaling: None, tied: true, ..with_all };
    for (name, family) in [("qwen2", qwen), ("llama3", with_all)] {
        let Some(tok) = common::shared(&format!("tokenizers/{name}")) else { return };
        let vocab = brigade::models::tokenizer::Tokenizer::from_file(&tok).unwrap().vocab_size();
        let cfg = brigade::models::GptConfig {
            vocab_size: vocab,
            family: family.into(),
            ..brigade::models::GptConfig::example(Family::ALL[1], vocab, 64)
        };
        let ck = tmp.path().join(name);
        let params = checkpoint(&ck, cfg, &tok);
        let out = tmp.path().join(format!("{name}.gguf"));
        brigade::models::gguf::export(&ck, &out, brigade::models::gguf::FileType::F32).unwrap();
        let read = open_config(&out).unwrap();
        let (_, back) = open_model(&out).unwrap();
        assert!(back.iter().zip(&params).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: parameters differ");
        if name == "qwen2" {
            assert_eq!(format!("{read:?}"), format!("{cfg:?}"), "{name}");
        } else {
            // llama.cpp keeps Llama 3's scaling as its factors only, which a small head's few
            // frequencies do not pin down: the scaling read back gives the file's factors
            let again = tmp.path().join("again");
            checkpoint(&again, read, &tok);
            let out2 = tmp.path().join("again.gguf");
            brigade::models::gguf::export(&again, &out2, brigade::models::gguf::FileType::F32).unwrap();
            let factors = |p: &std::path::Path| {
                let g = brigade::models::gguf::read::Gguf::open(p).unwrap();
                g.dequantize(g.tensor("rope_freqs.weight").unwrap())
            };
            assert_eq!(factors(&out2), factors(&out));
            let strip =
                |c: &brigade::models::GptConfig| format!("{c:?}").split("rope_scaling").next().unwrap().to_string();
            assert_eq!(strip(&read), strip(&cfg));
            assert!(format!("{read:?}").contains("factor: 8.0"), "{read:?}");
        }
        let meta = metadata_folder(&out).unwrap();
        let ours = brigade::models::tokenizer::Tokenizer::from_file(&meta).unwrap();
        let theirs = brigade::models::tokenizer::Tokenizer::from_file(&ck).unwrap();
        assert_eq!(
            ours.specials(),
            brigade::models::tokenizer::Specials { config: ours.specials().config, ..theirs.specials() }
        );
        let text = "<|im_start|>user\nHow's 2024's weather?  \n\n It's 33°C — 3.14159!<|im_end|>\n ünïcödé ✓ 🦙 I'VE been 'told";
        assert_eq!(ours.encode(text).unwrap(), theirs.encode(text).unwrap(), "{name}");
        let cfg_of = |d: &std::path::Path| -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(d.join("tokenizer_config.json")).unwrap()).unwrap()
        };
        assert_eq!(cfg_of(&meta)["chat_template"], cfg_of(&ck)["chat_template"], "{name}");
        // the second open reads the unpacked folder again, not a new one
        assert_eq!(metadata_folder(&out).unwrap(), meta);
    }
}

/// A GGUF file's header with the bytes after `key` (its value's type and value) replaced.
fn patched(file: &[u8], find: &[u8], with: &[u8]) -> Vec<u8> {
    assert_eq!(find.len(), with.len());
    let at = file
        .windows(find.len())
        .position(|w| w == find)
        .unwrap_or_else(|| panic!("{:?} not in the file", String::from_utf8_lossy(find)));
    let mut out = file.to_vec();
    out[at..at + with.len()].copy_from_slice(with);
    out
}

/// A string value as GGUF writes it after its key: type 8, a u64 length, the bytes.
fn str_value(key: &str, v: &str) -> Vec<u8> {
    let mut b = key.as_bytes().to_vec();
    b.extend(8u32.to_le_bytes());
    b.extend((v.len() as u64).to_le_bytes());
    b.extend(v.as_bytes());
    b
}

#[test]
fn bad_gguf_files_fail_with_one_line_naming_the_problem() {
    use brigade::models::open::{metadata_folder, open_model};
    let Some(tok) = common::shared("tokenizers/llama3") else { return };
    let tmp = tempfile::tempdir().unwrap();
    one_cache();
    let vocab = brigade::models::tokenizer::Tokenizer::from_file(&tok).unwrap().vocab_size();
    let family = brigade::models::family::Family::ALL[1];
    let cfg =
        brigade::models::GptConfig { vocab_size: vocab, ..brigade::models::GptConfig::example(family, vocab, 64) };
    let ck = tmp.path().join("ck");
    checkpoint(&ck, cfg, &tok);
    let good = tmp.path().join("good.gguf");
    brigade::models::gguf::export(&ck, &good, brigade::models::gguf::FileType::F32).unwrap();
    let whole = std::fs::read(&good).unwrap();
    let mut k = 0;
    let mut fails = |bytes: &[u8], want: &str| {
        k += 1;
        let p = tmp.path().join(format!("bad{k}.gguf"));
        std::fs::write(&p, bytes).unwrap();
        let e = match open_model(&p) {
            Err(e) => e.to_string(),
            Ok(_) => metadata_folder(&p).err().map(|e| e.to_string()).unwrap_or_default(),
        };
        assert!(e.contains(want), "expected '{want}' in: {e}");
        assert_eq!(e.lines().count(), 1, "one line: {e}");
    };
    fails(b"{\"not\": \"gguf\"}", "is a file but not GGUF");
    fails(&whole[..whole.len() - 1000], "runs past the end of the file");
    fails(&whole[..200], "truncated");
    fails(
        &patched(&whole, &str_value("general.architecture", "llama"), &str_value("general.architecture", "gemma")),
        "general.architecture is 'gemma'",
    );
    fails(
        &patched(&whole, b"llama.feed_forward_length", b"llama.feed_forward_lengtX"),
        "'llama.feed_forward_length' is missing",
    );
    let mut emb = b"llama.embedding_length".to_vec();
    emb.extend(4u32.to_le_bytes());
    let mut smaller = emb.clone();
    emb.extend(64u32.to_le_bytes());
    smaller.extend(32u32.to_le_bytes());
    fails(&patched(&whole, &emb, &smaller), "the metadata's model has");
    fails(
        &patched(&whole, &str_value("tokenizer.ggml.model", "gpt2"), &str_value("tokenizer.ggml.model", "bert")),
        "tokenizer.ggml.model is 'bert'",
    );
    fails(
        &patched(&whole, &str_value("tokenizer.ggml.pre", "llama-bpe"), &str_value("tokenizer.ggml.pre", "llama-xyz")),
        "tokenizer.ggml.pre is 'llama-xyz'",
    );
    let missing = tmp.path().join("nope.gguf");
    let e = open_model(&missing).unwrap_err().to_string();
    assert!(e.contains("no such checkpoint"), "{e}");
}

/// `train --init MODEL.gguf` starts where `--init` of the folder it was written from starts:
/// the same shape (from the file's metadata), every rank's slice of the same weights (gathered:
/// the folder's exactly), the same first loss, alone and with the matrices split over two ranks.
#[test]
fn train_init_from_a_gguf_file_starts_where_its_folder_does() {
    use brigade::layout::Layout;
    use brigade::models::family::Family;
    use brigade::parallel::{Mesh, MeshShape};
    use brigade::train::{TrainConfig, Trainer};
    let Some(tok) = common::shared("tokenizers/qwen2") else { return };
    let tmp = tempfile::tempdir().unwrap();
    one_cache();
    let Family::Llama(with_all) = Family::ALL[1] else { panic!("the second family is Llama's") };
    let family = brigade::models::family::Llama { o_bias: false, rope_scaling: None, tied: true, ..with_all };
    let vocab = brigade::models::tokenizer::Tokenizer::from_file(&tok).unwrap().vocab_size();
    let cfg = brigade::models::GptConfig {
        vocab_size: vocab,
        family: family.into(),
        ..brigade::models::GptConfig::example(Family::ALL[1], vocab, 64)
    };
    let ck = tmp.path().join("folder");
    let params = checkpoint(&ck, cfg, &tok);
    let file = tmp.path().join("model.gguf");
    brigade::models::gguf::export(&ck, &file, brigade::models::gguf::FileType::F32).unwrap();
    let text = tmp.path().join("corpus.txt");
    std::fs::write(&text, "The quick brown fox jumps over the lazy dog. ".repeat(200)).unwrap();
    let (b, t) = (2, 32);
    let x: Vec<u32> = (0..b * t).map(|i| ((i * 7919 + 13) % vocab) as u32).collect();
    let y: Vec<i32> = (0..b * t).map(|i| ((i * 104729 + 5) % vocab) as i32).collect();
    for spec in ["dp=1", "tp=2"] {
        let layout = Layout::parse(spec).unwrap();
        let first = |init: &std::path::Path| {
            let cfg = TrainConfig {
                model: String::new(),
                init: Some(init.to_path_buf()),
                data: Some(text.clone()),
                steps: 2,
                batch: b,
                seq: Some(t),
                eval_every: 0,
                ..TrainConfig::default()
            };
            brigade_comm::local::run(layout.world(), |world| {
                let mesh = Mesh::new(&world, MeshShape::of(&layout))?;
                let mut tr = Trainer::on_mesh(cfg.clone(), mesh, &layout)?;
                let local = tr.local_params()?.into_owned();
                let full = tr.full_params()?.unwrap_or(local);
                let s = brigade::with_threads(1, || tr.step_on(&x, &y))??;
                Ok::<_, brigade::Error>((full, s.loss))
            })
            .unwrap_or_else(|e| panic!("--init {} on {spec}: {e}", init.display()))
        };
        let (from_folder, from_file) = (first(&ck), first(&file));
        assert_eq!(from_file[0].0, params, "{spec}: the GGUF's weights, gathered, are not the folder's");
        for (r, (a, f)) in from_file.iter().zip(&from_folder).enumerate() {
            assert_eq!(a.1.to_bits(), f.1.to_bits(), "{spec}: rank {r}'s first loss {} vs the folder's {}", a.1, f.1);
        }
    }
}
