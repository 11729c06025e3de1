//! `--layout` strings (`tp=8,pp=4,zero=1,…`): parsed, never a panic.
#![no_main]

use brigade::plan::Fixed;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = Fixed::parse(s);
    }
});
