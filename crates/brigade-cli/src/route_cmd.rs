//! `brigade route`: the router over `brigade serve` replicas.

use anyhow::{bail, Result};
use brigade_serve::route::policy::Policy;
use brigade_serve::route::{self, RouteOptions};
use clap::Args;

#[derive(Args, Debug)]
pub struct RouteArgs {
    /// A replica's base URL (http://host:port); give one --replica per server.
    #[arg(long = "replica", required = true)]
    replicas: Vec<String>,
    /// round-robin, least-loaded (fewest requests in flight) or cache-aware (the replica that
    /// most likely holds the prompt's prefix in its cache, unless the load is unbalanced).
    #[arg(long, default_value = "cache-aware")]
    policy: String,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port (printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
}

pub fn run(a: RouteArgs) -> Result<()> {
    let Some(policy) = Policy::parse(&a.policy) else {
        bail!("--policy {}: expected round-robin, least-loaded or cache-aware", a.policy);
    };
    let o = RouteOptions { replicas: a.replicas, policy, host: a.host, port: a.port, wait_for_models: false };
    route::run(o, |addr| println!("brigade route: listening on http://{addr}"))?;
    Ok(())
}
