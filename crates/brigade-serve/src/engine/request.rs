//! What the engine takes and gives: a request and how it is sampled and admitted, the
//! constraint a structured output puts on it, each token it generates, and why a request is
//! refused before it runs.

/// How a request is sampled and when it stops.
#[derive(Clone, Debug)]
pub struct Sampling {
    /// 0: greedy.
    pub temperature: f32,
    /// 0: all tokens.
    pub top_k: usize,
    /// 1: all tokens.
    pub top_p: f32,
    /// Above 1, every token already in the sequence (prompt or generated) is made less likely
    /// before sampling: its logit divided by this when positive, multiplied when negative
    /// (`transformers`' and vLLM's rule); 1: none. Log-probabilities reported stay the model's.
    pub repetition_penalty: f32,
    pub seed: u64,
    pub max_tokens: usize,
    /// Generation ends after emitting one of these.
    pub stop_tokens: Vec<u32>,
    /// How many of the most likely tokens to report with each generated one (0: none).
    pub top_logprobs: usize,
}

impl Sampling {
    /// Greedy decoding of at most `max_tokens` tokens: no penalty, no stop token, no
    /// alternatives reported (the settings the others are written as changes of).
    pub fn greedy(max_tokens: usize) -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            seed: 0,
            max_tokens,
            stop_tokens: vec![],
            top_logprobs: 0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Request {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub sampling: Sampling,
}

/// A constraint on a sequence's tokens (structured outputs): which tokens may come next.
pub trait Constrain: Send {
    /// Sets every token the constraint forbids next to −∞; false when it allows none.
    fn mask(&mut self, row: &mut [f32]) -> bool;
    /// Takes the token emitted; true when the output is complete (nothing may follow).
    fn commit(&mut self, token: u32) -> bool;
    /// Whether the output so far is complete.
    fn satisfied(&mut self) -> bool;
}

/// How a request shares work with another, has its tokens given, or is constrained: what a
/// program's branches, a select's scoring and structured outputs ask of the engine beyond a
/// plain request.
#[derive(Default)]
pub struct Admit {
    /// A sibling whose prompt shares this one's leading tokens (a fork's or a map's branch 0):
    /// this request waits until the sibling has computed the shared tokens, then takes their
    /// keys and values — whole blocks through the prefix cache, the partial last one copied —
    /// instead of computing them again. A sibling that is gone shares only what is cached.
    pub follows: Option<u64>,
    /// Tokens emitted in this order in place of sampled ones, each reported with its
    /// log-probability under the model (a select scoring its choices); the request ends after
    /// the last of them.
    pub forced: Vec<u32>,
    /// Only tokens this constraint allows are sampled; the request ends when its output is
    /// complete.
    pub constraint: Option<Box<dyn Constrain>>,
}

impl std::fmt::Debug for Admit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admit")
            .field("follows", &self.follows)
            .field("forced", &self.forced)
            .field("constrained", &self.constraint.is_some())
            .finish()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// `max_tokens` generated.
    Length,
    /// A stop token was emitted.
    Stop,
    /// The model's context is full.
    Context,
    /// The constraint's output is complete (its last token is part of the text).
    Done,
}

/// A token generated for a request in a step. Two are equal when they carry the same token,
/// scores and finish, however much of the prompt came from the cache (`prompt_computed`).
#[derive(Clone, Debug)]
pub struct Output {
    pub id: u64,
    pub token: u32,
    /// Natural log of the token's probability under the model (before temperature).
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
    pub finished: Option<Finish>,
    /// Prompt tokens the engine computed for this request so far (the rest came from the cache
    /// or a sibling).
    pub prompt_computed: usize,
    /// A constrained request that ended (by length or context) before its output was complete.
    pub unmet: bool,
}

impl PartialEq for Output {
    fn eq(&self, o: &Output) -> bool {
        (self.id, self.token, self.logprob, &self.top, self.finished) == (o.id, o.token, o.logprob, &o.top, o.finished)
    }
}

/// Why the engine refuses a request before it runs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "the prompt has {len} tokens; this model's context is {context} (prompt and at least one generated token)"
    )]
    PromptTooLong { len: usize, context: usize },
    #[error("token {token} is outside the vocabulary (0..{vocab})")]
    OutsideVocabulary { token: u32, vocab: usize },
    #[error("the prompt needs {need} KV blocks; the cache holds {total}")]
    CacheTooSmall { need: usize, total: usize },
    #[error("forced token {token} is outside the vocabulary (0..{vocab})")]
    ForcedOutsideVocabulary { token: u32, vocab: usize },
}
