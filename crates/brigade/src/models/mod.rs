pub mod bert;
pub mod block;
pub mod config;
pub mod generate;
pub mod gpt;
pub mod units;
pub use generate::{generate, SampleOptions};
pub use gpt::{Activations, Gpt, GptConfig, Input, Output, PRESETS};
