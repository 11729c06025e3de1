pub mod gpt;
pub use gpt::{Activations, Gpt, GptConfig};
