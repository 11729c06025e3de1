//! What `GET /metrics` reports, in Prometheus' text format: requests by status, queue depth,
//! running batch size, KV blocks, prefix-cache hits, tokens, latency histograms, and what
//! each tensor-parallel rank holds.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// What the structured-output engine counts: grammars compiled, the seconds their compiling
/// took, and constraints that started from a cached compiled grammar instead.
#[derive(Clone, Debug, Default)]
pub struct GrammarCounters {
    pub compiles: Counter,
    pub compile_seconds: Counter<f64, AtomicU64>,
    pub cache_hits: Counter,
}

#[derive(Clone)]
pub struct Metrics {
    pub requests: Family<Vec<(String, String)>, Counter>,
    pub waiting: Gauge,
    pub running: Gauge,
    pub kv_blocks_used: Gauge,
    pub kv_blocks_total: Gauge,
    pub prefix_cache_hits: Counter,
    pub preemptions: Counter,
    pub generated_tokens: Counter,
    pub prompt_tokens: Counter,
    pub ttft: Histogram,
    pub itl: Histogram,
    /// Set by each tensor-parallel rank itself once its share is built: the rank's KV-cache
    /// blocks and the bytes of its weights (so a scrape shows that N ranks run, each with 1/N).
    pub rank_kv_blocks: Family<Vec<(String, String)>, Gauge>,
    pub rank_weight_bytes: Family<Vec<(String, String)>, Gauge>,
    pub grammars: GrammarCounters,
    registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut r = Registry::default();
        let requests = Family::<Vec<(String, String)>, Counter>::default();
        let (waiting, running, kv_blocks_used, kv_blocks_total) =
            (Gauge::default(), Gauge::default(), Gauge::default(), Gauge::default());
        let (prefix_cache_hits, preemptions, generated_tokens, prompt_tokens) =
            (Counter::default(), Counter::default(), Counter::default(), Counter::default());
        // 1 ms … 65 s
        let ttft = Histogram::new(exponential_buckets(0.001, 2.0, 17));
        // 0.5 ms … 8 s
        let itl = Histogram::new(exponential_buckets(0.0005, 2.0, 15));
        r.register("brigade_requests", "HTTP requests to /v1/completions, by status code", requests.clone());
        r.register("brigade_queue_depth", "Sequences waiting to join the running batch", waiting.clone());
        r.register("brigade_running_sequences", "Sequences in the running batch", running.clone());
        r.register("brigade_kv_blocks_used", "KV-cache blocks held by sequences", kv_blocks_used.clone());
        r.register("brigade_kv_blocks", "KV-cache blocks in all", kv_blocks_total.clone());
        r.register(
            "brigade_prefix_cache_hits",
            "KV blocks reused from the prefix cache instead of computed",
            prefix_cache_hits.clone(),
        );
        r.register("brigade_preemptions", "Sequences preempted when KV blocks ran out", preemptions.clone());
        r.register("brigade_generation_tokens", "Tokens generated", generated_tokens.clone());
        r.register("brigade_prompt_tokens", "Prompt tokens of accepted requests", prompt_tokens.clone());
        r.register("brigade_time_to_first_token_seconds", "From a request's arrival to its first token", ttft.clone());
        r.register("brigade_inter_token_latency_seconds", "Between consecutive tokens of a sequence", itl.clone());
        let (rank_kv_blocks, rank_weight_bytes) = (Family::default(), Family::default());
        r.register("brigade_rank_kv_blocks", "KV-cache blocks each tensor-parallel rank holds", rank_kv_blocks.clone());
        r.register(
            "brigade_rank_weight_bytes",
            "Bytes of the weights each tensor-parallel rank holds",
            rank_weight_bytes.clone(),
        );
        let grammars = GrammarCounters::default();
        r.register(
            "brigade_grammar_compiles",
            "Grammars compiled (tools, structured outputs)",
            grammars.compiles.clone(),
        );
        r.register(
            "brigade_grammar_compile_seconds",
            "Seconds spent compiling grammars",
            grammars.compile_seconds.clone(),
        );
        r.register(
            "brigade_grammar_cache_hits",
            "Constraints started from a cached compiled grammar",
            grammars.cache_hits.clone(),
        );
        Metrics {
            grammars,
            requests,
            waiting,
            running,
            kv_blocks_used,
            kv_blocks_total,
            prefix_cache_hits,
            preemptions,
            generated_tokens,
            prompt_tokens,
            ttft,
            itl,
            rank_kv_blocks,
            rank_weight_bytes,
            registry: Arc::new(r),
        }
    }

    pub fn count_status(&self, code: u16) {
        self.requests.get_or_create(&vec![("status".to_string(), code.to_string())]).inc();
    }

    /// What the engine (rank 0) holds, reported as it is built — before it runs, so a server
    /// that says it is ready reports its cache (set on the engine's thread, a /metrics read
    /// just after /ready could see 0 blocks).
    pub fn engine_holds(&self, kv_blocks: usize, weight_bytes: usize) {
        self.rank_holds(0, kv_blocks, weight_bytes);
        self.kv_blocks_total.set(kv_blocks as i64);
    }

    /// What rank `rank` holds, reported by the rank itself.
    pub fn rank_holds(&self, rank: usize, kv_blocks: usize, weight_bytes: usize) {
        let label = vec![("rank".to_string(), rank.to_string())];
        self.rank_kv_blocks.get_or_create(&label).set(kv_blocks as i64);
        self.rank_weight_bytes.get_or_create(&label).set(weight_bytes as i64);
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &self.registry).expect("formatting into a String");
        s
    }
}
