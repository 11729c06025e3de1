//! `brigade route` from outside, over two `brigade serve` replicas of the tiny trained model.
//! The reference is one replica asked directly: brigade's engine is batch invariant, so a
//! prompt's greedy tokens and log-probabilities do not depend on which replica serves it or
//! what else it serves — through every policy, streamed or not, and while a replica is killed
//! under load (no request that had not started streaming is lost).

mod common;

use common::server::{checkpoint, start, Server};
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `brigade route --port 0 ARGS`.
fn route(args: &[&str]) -> Server {
    common::server::start_command("route", args)
}

fn replica_args(ck: &str) -> Vec<&str> {
    vec!["--checkpoint", ck, "--threads", "1"]
}

/// Prompts: lines of prose, and two sessions' turns that extend a shared system prompt.
fn prompts() -> Vec<String> {
    // (a block of the router's index is 64 bytes; the model's context is 64 tokens)
    let system = "You are the ring: keys and values travel round it, block by block. ";
    let mut p: Vec<String> = [
        "Every layout computes the same numbers",
        "The planner predicts step time",
        "A replica that dies is taken out",
        "brigade trains GPT-2",
        "The ring passes keys",
        "Serving batches requests",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    p.push(format!("{system}One?"));
    p.push(format!("{system}One? Two?"));
    p
}

fn body(prompt: &str, stream: bool) -> Value {
    json!({"model": "tiny-bpe", "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1, "stream": stream})
}

/// (text, token log-probabilities) of a non-streamed completion.
fn answer(v: &Value) -> (String, Vec<f64>) {
    let c = &v["choices"][0];
    let lp = c["logprobs"]["token_logprobs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    (c["text"].as_str().unwrap().to_string(), lp)
}

/// The same from a stream's events.
fn streamed(events: &[Value]) -> (String, Vec<f64>) {
    let mut text = String::new();
    let mut lp = Vec::new();
    for e in events {
        let c = &e["choices"][0];
        text.push_str(c["text"].as_str().unwrap_or(""));
        if let Some(a) = c["logprobs"]["token_logprobs"].as_array() {
            lp.extend(a.iter().map(|x| x.as_f64().unwrap()));
        }
    }
    (text, lp)
}

async fn reference(direct: &Server) -> Vec<(String, Vec<f64>)> {
    let mut out = Vec::new();
    for p in prompts() {
        let (s, v) = direct.post(body(&p, false)).await;
        assert_eq!(s, 200, "{v}");
        out.push(answer(&v));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_policy_gives_each_prompt_one_servers_tokens() {
    let ck = checkpoint().to_str().unwrap().to_string();
    let (a, b) = (start(&replica_args(&ck)), start(&replica_args(&ck)));
    a.wait_ready().await;
    b.wait_ready().await;
    let want = reference(&a).await;
    for policy in ["round-robin", "least-loaded", "cache-aware"] {
        let r = route(&["--replica", &a.url, "--replica", &b.url, "--policy", policy]);
        r.wait_ready().await;
        // every prompt twice at once, and streamed
        let ps = prompts();
        let jobs = ps.iter().chain(ps.iter()).map(|p| r.post(body(p, false)));
        let got = futures_util::future::join_all(jobs).await;
        for (i, (s, v)) in got.iter().enumerate() {
            assert_eq!(*s, 200, "{policy}: {v}");
            assert_eq!(answer(v), want[i % ps.len()], "{policy}: prompt {:?}", ps[i % ps.len()]);
        }
        for (p, w) in ps.iter().zip(&want).take(3) {
            assert_eq!(&streamed(&r.stream(body(p, true)).await), w, "{policy}: streamed {p:?}");
        }
        let sent = |m: &str| {
            let m = m.to_string();
            let r = &r;
            async move { r.metric(&m).await }
        };
        assert_eq!(sent("brigade_route_replica_requests_total").await, 2.0 * ps.len() as f64 + 3.0);
        if policy == "cache-aware" {
            // the sessions' turns shared their system prompt: the later ones matched it
            assert!(sent("brigade_route_replica_prefix_blocks_matched_total").await > 0.0);
        }
        // a model no replica serves: 404, OpenAI's body
        let (s, v) = r.post(json!({"model": "gpt-9", "prompt": "x", "max_tokens": 1})).await;
        assert_eq!(s, 404, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("'gpt-9' is not served here"), "{v}");
    }
    // round robin shares the work: both replicas were sent requests
    let r = route(&["--replica", &a.url, "--replica", &b.url, "--policy", "round-robin"]);
    r.wait_ready().await;
    for p in prompts() {
        r.post(body(&p, false)).await;
    }
    let text = reqwest::get(format!("{}/metrics", r.url)).await.unwrap().text().await.unwrap();
    for u in [&a.url, &b.url] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("brigade_route_replica_requests_total{{replica=\"{u}\"}}")))
            .unwrap();
        assert!(line.ends_with(" 4"), "round robin over 8 prompts: {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_under_load_loses_no_request_that_had_not_started() {
    let ck = checkpoint().to_str().unwrap().to_string();
    let (a, mut b) = (start(&replica_args(&ck)), start(&replica_args(&ck)));
    a.wait_ready().await;
    b.wait_ready().await;
    let want = reference(&a).await;
    let r = route(&["--replica", &a.url, "--replica", &b.url, "--policy", "least-loaded"]);
    r.wait_ready().await;
    let ps = prompts();
    let long = |p: &str| json!({"model": "tiny-bpe", "prompt": p, "max_tokens": 8, "temperature": 0, "logprobs": 1});
    let metric_of = |url: String, name: String| async move {
        let text = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
        text.lines().find(|l| l.starts_with(&name)).map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
    };
    let in_flight_b = format!("brigade_route_replica_in_flight{{replica=\"{}\"}}", b.url);
    // 48 requests at once; once some are in flight on b, b is killed
    let jobs: Vec<_> = (0..48)
        .map(|i| {
            let (url, body) = (r.url.clone(), long(&ps[i % ps.len()]));
            tokio::spawn(async move {
                let resp =
                    reqwest::Client::new().post(format!("{url}/v1/completions")).json(&body).send().await.unwrap();
                (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let t0 = Instant::now();
    while metric_of(r.url.clone(), in_flight_b.clone()).await.unwrap_or(0.0) < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no request reached replica b");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    b.child.kill().unwrap();
    let _ = b.child.wait();
    for (i, j) in jobs.into_iter().enumerate() {
        let (s, v) = j.await.unwrap();
        assert_eq!(s, 200, "request {i} was lost: {v}");
        assert_eq!(answer(&v), want[i % ps.len()], "request {i}");
    }
    let retried = metric_of(r.url.clone(), "brigade_route_retries_total".into()).await.unwrap();
    println!("{retried} requests retried after replica b was killed");
    assert!(retried >= 1.0, "b was killed with requests in flight: some must have been retried");
    // taken out within 5 seconds; the service stays ready on the other
    let t0 = Instant::now();
    loop {
        let text = reqwest::get(format!("{}/metrics", r.url)).await.unwrap().text().await.unwrap();
        if text.contains(&format!("brigade_route_replica_up{{replica=\"{}\"}} 0", b.url)) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "the dead replica is still up after 5 s:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(reqwest::get(format!("{}/ready", r.url)).await.unwrap().status(), 200);
    let (s, v) = r.post(long(&ps[0])).await;
    assert_eq!((s, answer(&v)), (200, want[0].clone()));
    // a server answering at b's address again is brought back within 5 seconds
    let port = b.url.rsplit(':').next().unwrap().to_string();
    let mut back = Command::new(env!("CARGO_BIN_EXE_brigade"))
        .args(["serve", "--port", &port, "--checkpoint", &ck, "--threads", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up_b = format!("brigade_route_replica_up{{replica=\"{}\"}}", b.url);
    let t0 = Instant::now();
    while metric_of(r.url.clone(), up_b.clone()).await != Some(1.0) {
        assert!(t0.elapsed() < Duration::from_secs(20), "replica b was not brought back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent_b = format!("brigade_route_replica_requests_total{{replica=\"{}\"}}", b.url);
    let before = metric_of(r.url.clone(), sent_b.clone()).await.unwrap();
    let jobs = (0..8).map(|i| r.post(long(&ps[i % ps.len()])));
    for (i, (s, v)) in futures_util::future::join_all(jobs).await.iter().enumerate() {
        assert_eq!((*s, answer(v)), (200, want[i % ps.len()].clone()));
    }
    assert!(metric_of(r.url.clone(), sent_b).await.unwrap() > before, "the replica brought back takes requests");
    let _ = back.kill();
    let _ = back.wait();
}

#[test]
fn routers_that_cannot_serve_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_brigade"))
            .arg("route")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let e = run(&["--replica", "http://127.0.0.1:9", "--port", "0"]);
    assert!(e.contains("no replica answers (http://127.0.0.1:9)"), "{e}");
    let e = run(&["--replica", "http://127.0.0.1:9", "--policy", "random"]);
    assert!(e.contains("--policy random: expected round-robin, least-loaded or cache-aware"), "{e}");
    let e = run(&["--replica", "127.0.0.1:9"]);
    assert!(e.contains("expected a URL such as http://"), "{e}");
    // replicas of two different models
    let ck = checkpoint().to_str().unwrap().to_string();
    let a = start(&replica_args(&ck));
    let b = start(&["--model", "tiny"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        a.wait_ready().await;
        b.wait_ready().await;
    });
    let e = run(&["--replica", &a.url, "--replica", &b.url, "--port", "0"]);
    assert!(
        e.contains("the replicas serve different models") && e.contains("serves tiny-bpe") && e.contains("serves tiny"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_with_replicas_starts_them_behind_a_router_and_stops_them() {
    let ck = checkpoint().to_str().unwrap().to_string();
    let direct = start(&replica_args(&ck));
    direct.wait_ready().await;
    let want = reference(&direct).await;
    let mut s = start(&["--checkpoint", &ck, "--threads", "1", "--replicas", "2"]);
    s.wait_ready().await;
    let ps = prompts();
    let got = futures_util::future::join_all(ps.iter().map(|p| s.post(body(p, false)))).await;
    for (i, (st, v)) in got.iter().enumerate() {
        assert_eq!(*st, 200, "prompt {:?}: {v}", ps[i]);
        assert_eq!(answer(v), want[i].clone(), "prompt {:?}", ps[i]);
    }
    let text = reqwest::get(format!("{}/metrics", s.url)).await.unwrap().text().await.unwrap();
    let up: Vec<&str> = text.lines().filter(|l| l.starts_with("brigade_route_replica_up{")).collect();
    assert_eq!(up.len(), 2, "{text}");
    assert!(up.iter().all(|l| l.ends_with(" 1")), "{text}");
    // SIGTERM: the router stops, then its replicas drain and exit
    let pid = s.child.id() as i32;
    // SAFETY: signals the child process this test started
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status}");
    let left = Command::new("pgrep")
        .args(["-f", &format!("serve --checkpoint {ck} --threads 1 --host 127.0.0.1 --port 0")])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty(), "replicas outlived the service: {}", String::from_utf8_lossy(&left.stdout));
}
