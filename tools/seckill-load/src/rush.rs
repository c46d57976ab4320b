//! `seckill-load rush VOUCHER`: a crowd of buyers over real HTTP against the running
//! stack's seckill-http (`SECKILL_HTTP_URL`), paced, so that a sale can be watched while
//! it happens (the operators' live view, `seckill status --watch`, a browser beside it).
//!
//! Unlike `bench`, which calls the handler in process to measure it, this goes through
//! the stack's gateway like real buyers: one token per buyer (signed with the stack's
//! `SECKILL_DEV_JWT_SECRET`), each buyer one attempt, retried with backoff only on `503`
//! and `429` as a client must. It prints what the crowd got and exits 2 if any answer
//! was one a buyer should never see (a 5xx other than `503`, or a body that is not the
//! contract's).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use seckill_cli::stack_env::StackEnv;
use seckill_shared::auth::mint_hs256;
use seckill_shared::domain::now_millis;
use serde::Serialize;
use tokio::sync::Semaphore;

/// The crowd's size and pace.
#[derive(Debug, Clone, clap::Args)]
pub struct RushOptions {
    /// The voucher to buy (its decimal id)
    pub voucher: String,
    /// Buyers, each trying once (retrying only 503 and 429)
    #[arg(long, default_value_t = 500)]
    pub buyers: u32,
    /// Buyers starting per second (0: all at once, up to --callers at a time)
    #[arg(long, default_value_t = 100)]
    pub rate: u32,
    /// Requests in flight at most
    #[arg(long, default_value_t = 32)]
    pub callers: usize,
    /// The buyers' user ids are PREFIX-0 .. PREFIX-(buyers-1)
    #[arg(long, default_value = "rush")]
    pub user_prefix: String,
}

/// What the crowd got.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RushSummary {
    /// Final answers by status and code (`202`, `409 sold_out`, ...).
    pub answers: BTreeMap<String, u64>,
    /// Retries after a 503 or 429.
    pub retries: u64,
    /// Answers a buyer should never see.
    pub unexpected: u64,
    pub elapsed_ms: u64,
}

/// Runs the crowd against the stack in `env`.
pub async fn rush(env: &StackEnv, o: &RushOptions) -> anyhow::Result<RushSummary> {
    let base = env.get("SECKILL_HTTP_URL")?;
    let secret = env.get("SECKILL_DEV_JWT_SECRET")?;
    let url = format!("{base}/vouchers/{}/seckill", o.voucher);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .context("an HTTP client")?;
    let bar = ProgressBar::new(u64::from(o.buyers)).with_style(
        ProgressStyle::with_template("rush [{bar:40}] {pos}/{len} buyers  {msg}")?
            .progress_chars("=> "),
    );
    let slots = Arc::new(Semaphore::new(o.callers.max(1)));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(o.buyers as usize);
    for i in 0..o.buyers {
        if o.rate > 0 {
            // Pace by the clock, not by sleeps added up, so the rate holds.
            let due = started + Duration::from_secs_f64(f64::from(i) / f64::from(o.rate));
            tokio::time::sleep_until(due.into()).await;
        }
        let permit = slots.clone().acquire_owned().await?;
        let token = mint_hs256(
            secret.as_bytes(),
            &format!("{}-{i}", o.user_prefix),
            None,
            now_millis() / 1000 + 600,
        );
        let (http, url, bar) = (http.clone(), url.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let out = one_buyer(&http, &url, &token).await;
            bar.inc(1);
            drop(permit);
            out
        }));
    }
    let mut summary = RushSummary::default();
    for t in tasks {
        let (answer, retries, unexpected) = t.await?;
        *summary.answers.entry(answer).or_default() += 1;
        summary.retries += retries;
        summary.unexpected += u64::from(unexpected);
        bar.set_message(format!("{:?}", summary.answers));
    }
    bar.finish();
    summary.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(summary)
}

/// One buyer's attempt: the final answer (`"202"`, `"409 sold_out"`), the retries, and
/// whether the answer was one a buyer should never see.
async fn one_buyer(http: &reqwest::Client, url: &str, token: &str) -> (String, u64, bool) {
    let mut retries = 0;
    loop {
        let res = http.post(url).bearer_auth(token).send().await;
        let (status, body) = match res {
            Ok(r) => {
                let status = r.status().as_u16();
                (
                    status,
                    r.json::<serde_json::Value>().await.unwrap_or_default(),
                )
            }
            Err(_) => (0, serde_json::Value::Null),
        };
        if matches!(status, 0 | 429 | 503) && retries < 5 {
            retries += 1;
            // Full jitter over an exponential ceiling, as the reference client does.
            let ceiling = 200u64 << retries;
            tokio::time::sleep(Duration::from_millis(rand::random_range(0..=ceiling))).await;
            continue;
        }
        let code = body["code"].as_str().unwrap_or_default();
        let answer = match code {
            "" => status.to_string(),
            c => format!("{status} {c}"),
        };
        let unexpected = status == 0 || (status >= 500 && status != 503) || !body.is_object();
        return (answer, retries, unexpected);
    }
}
