pub mod generate;
pub mod gpt;
pub use generate::{generate, SampleOptions};
pub use gpt::{Activations, Gpt, GptConfig, PRESETS};
