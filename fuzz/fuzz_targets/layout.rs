//! `--layout` strings (`tp=8,pp=4,zero=1,schedule=zb,…`): parsed as a plan, as a training
//! layout and as a pipeline's schedule, never a panic.
#![no_main]

use brigade::plan::Fixed;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = Fixed::parse(s);
        let _ = brigade::parallel::training_layout(s, 1000);
        if let Ok(plan) = brigade::parallel::pipeline_plan(s, 8, None) {
            // every list the parser accepts runs on paper
            let _ = brigade::parallel::pipeline::simulate(&plan, &brigade::parallel::pipeline::Costs::UNIT);
        }
    }
});
