//! GGUF reading against llama.cpp's own files: each tensor type's blocks as `llama-quantize
//! --pure` wrote them from the real SmolLM2-135M-Instruct, dequantized bit for bit as gguf-py's
//! reference does (`tests/fixtures/gguf_blocks.json`, made by `scripts/make_gguf_fixture.py`).

use brigade::models::gguf::quants::GgmlType;
use serde_json::Value;

fn fixture() -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf_blocks.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
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
