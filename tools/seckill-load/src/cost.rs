//! `seckill-load cost`: what one sale costs on AWS, service by service, next to the
//! tutorial design (one database transaction per admission attempt) for the same sale.
//!
//! The model, stated so it can be argued with (every input is a flag; the defaults are
//! figures measured in docs/benchmarks.md, named on each flag):
//! - API Gateway: one HTTP API request per attempt.
//! - seckill-http: one Lambda invocation per attempt, billed in 1 ms steps at the
//!   function's memory (template.yaml); an admission is well under 1 ms of handler time.
//! - ElastiCache Serverless: ECPUs per attempt that reaches Redis (every attempt, an
//!   upper bound: a warm instance answers `sold_out` from memory), and the data stored,
//!   at least the metered minimum, for the hours the sale is kept.
//! - order-drainer: invoked every minute (EventBridge) for the hours, each invocation
//!   busy for its run (it keeps polling for most of the period), at its memory.
//! - Data API: requests per batch of orders (begin, lock, insert, stock, commit; an insert
//!   of a full batch counts its 32 KB payload units).
//! - Aurora Serverless v2: the cluster's minimum ACUs for the hours (the drain of one sale
//!   is seconds of work on top of that floor).
//! - The tutorial design: the same requests and invocations, but each attempt holds its
//!   invocation for a database transaction (`--tutorial-ms`) and makes
//!   `--tutorial-data-api` Data API requests; it needs no drainer.
//!
//! Prices come from `prices.json` beside this crate (each with its unit and source), or
//! `--prices FILE`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The price list this tool ships with.
const PRICES: &str = include_str!("../prices.json");

/// A sale and the figures it is priced from.
#[derive(Debug, Clone, Serialize, Deserialize, clap::Args)]
pub struct CostOptions {
    /// Units on sale
    #[arg(long = "cost-units", default_value_t = 1_000)]
    pub units: u64,
    /// Purchase attempts
    #[arg(long = "cost-attempts", default_value_t = 1_000_000)]
    pub attempts: u64,
    /// Distinct users (they share the attempts; each buys at most once)
    #[arg(long = "cost-users", default_value_t = 200_000)]
    pub users: u64,
    /// Hours the sale's infrastructure is attributed to it (cache storage floor, the
    /// drainer's schedule, the database's minimum capacity)
    #[arg(long, default_value_t = 1.0)]
    pub hours: f64,
    /// A price list (JSON like tools/seckill-load/prices.json)
    #[arg(long)]
    pub prices: Option<PathBuf>,
    /// seckill-http's billed milliseconds per request (handler p50 0.36 ms in release,
    /// docs/benchmarks.md footprint; Lambda bills at least 1 ms)
    #[arg(long, default_value_t = 1.0)]
    pub http_ms: f64,
    /// seckill-http's memory, MB (template.yaml)
    #[arg(long, default_value_t = 512.0)]
    pub http_memory_mb: f64,
    /// ECPUs per attempt reaching Redis (2.0: the buckets benchmark's Redis CPU per
    /// admission over a lone SET's)
    #[arg(long, default_value_t = 2.0)]
    pub ecpu_per_attempt: f64,
    /// order-drainer's memory, MB (template.yaml)
    #[arg(long, default_value_t = 256.0)]
    pub drainer_memory_mb: f64,
    /// Seconds each scheduled drainer invocation runs (DRAINER_MAX_RUN_MS 50,000)
    #[arg(long, default_value_t = 50.0)]
    pub drainer_seconds: f64,
    /// Orders per drain batch (DRAINER_BATCH_SIZE)
    #[arg(long, default_value_t = 1_000)]
    pub batch: u64,
    /// Data API requests per batch, payload units counted (begin, lock, stock, commit,
    /// and an insert of ~70 KB of rows: 3 units)
    #[arg(long, default_value_t = 7.0)]
    pub data_api_per_batch: f64,
    /// The Aurora Serverless v2 cluster's minimum capacity, ACUs
    #[arg(long, default_value_t = 0.5)]
    pub min_acu: f64,
    /// The tutorial design: milliseconds an attempt's invocation waits for its database
    /// transaction (1.73 ms: the tutorial consumer's 578 transactions/s on the local
    /// Data API, docs/benchmarks.md; Aurora through the Data API takes longer)
    #[arg(long, default_value_t = 1.73)]
    pub tutorial_ms: f64,
    /// The tutorial design: Data API requests per attempt (begin, check, update, insert,
    /// commit)
    #[arg(long, default_value_t = 5.0)]
    pub tutorial_data_api: f64,
    /// Price taking the units' payments with Stripe too (template EnableStripe): a NAT
    /// gateway for the hours (the functions reach Stripe from the VPC) and the data of
    /// Stripe's calls through it, Stripe's events through API Gateway and seckill-http,
    /// two secrets. The same in both designs (the tutorial takes no payment; it would
    /// need the same parts to)
    #[arg(long = "cost-stripe")]
    pub stripe: bool,
    /// Payments refunded per 100 units sold (late, after a cancel, a wrong amount)
    #[arg(long, default_value_t = 2.0)]
    pub refunds_per_100: f64,
    /// KB through the NAT per Stripe call, request and answer
    #[arg(long, default_value_t = 4.0)]
    pub stripe_call_kb: f64,
    /// Anonymous reads during the sale: `GET /vouchers/{id}` and the page files, by the
    /// buyer pages polling every 2 s (users x minutes x 30). Not counted by default
    #[arg(long = "cost-page-reads", default_value_t = 0)]
    pub page_reads: u64,
    /// Price the edge too (template EnableEdge): CloudFront and WAF for every request,
    /// attempts and reads; the reads the edge keeps never reach API Gateway or Lambda.
    /// The same in both designs
    #[arg(long = "cost-edge")]
    pub edge: bool,
    /// Edge locations serving the sale: each asks the origin at most once a second for
    /// each object it keeps (the voucher's answer, a page file)
    #[arg(long, default_value_t = 40.0)]
    pub edge_locations: f64,
    /// Seconds the anonymous reads last (the pages stay open before, during and after)
    #[arg(long, default_value_t = 600.0)]
    pub read_seconds: f64,
    /// KB per answer the edge sends out (a voucher's JSON, a compressed page file)
    #[arg(long, default_value_t = 1.0)]
    pub response_kb: f64,
    /// Order events per unit sold (EventBridge, docs/design.md "Order events"): 1 for a
    /// sale without a payment step (OrderConfirmed), 2 with one (awaiting payment, then
    /// paid or closed); refunds add three each with Stripe (due, requested, refunded)
    #[arg(long, default_value_t = 1.0)]
    pub events_per_order: f64,
    /// SQS requests per event at the template's example consumer queue (EventBridge's
    /// send, the consumer's receive and delete; 0: no such consumer)
    #[arg(long, default_value_t = 3.0)]
    pub queue_requests_per_event: f64,
}

#[derive(Debug, Clone, Deserialize)]
struct PriceList {
    region: String,
    checked: String,
    prices: BTreeMap<String, Price>,
}

#[derive(Debug, Clone, Deserialize)]
struct Price {
    value: f64,
    unit: String,
    source: String,
}

impl PriceList {
    fn get(&self, name: &str) -> anyhow::Result<f64> {
        self.prices
            .get(name)
            .map(|p| p.value)
            .with_context(|| format!("the price list has no {name}"))
    }
}

/// One line of the bill.
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    pub service: &'static str,
    pub what: String,
    pub ours_usd: f64,
    pub tutorial_usd: f64,
}

/// The bill of a sale, ours and the tutorial design's.
#[derive(Debug, Clone, Serialize)]
pub struct Bill {
    pub options: CostOptions,
    pub region: String,
    pub prices_checked: String,
    pub lines: Vec<Line>,
    /// The prices used: (name, value, unit, source).
    pub prices: Vec<(String, f64, String, String)>,
}

impl Bill {
    pub fn total(&self) -> (f64, f64) {
        self.lines
            .iter()
            .fold((0.0, 0.0), |(o, t), l| (o + l.ours_usd, t + l.tutorial_usd))
    }
}

/// Prices the sale `o`.
pub fn bill(o: &CostOptions) -> anyhow::Result<Bill> {
    let text = match &o.prices {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => PRICES.to_string(),
    };
    let list: PriceList = serde_json::from_str(&text).context("parsing the price list")?;
    let p = |name: &str| list.get(name);
    let a = o.attempts as f64;
    let million = 1e6;
    let gb = |mb: f64| mb / 1024.0;
    let lambda_s = p("lambda_arm64_per_gb_second")?;
    let lambda_req = p("lambda_per_million_requests")? / million;
    let http_billed_ms = o.http_ms.ceil().max(1.0);
    let tutorial_billed_ms = (o.http_ms + o.tutorial_ms).ceil().max(1.0);
    let http = |ms: f64| a * (lambda_req + ms / 1000.0 * gb(o.http_memory_mb) * lambda_s);
    let invocations = o.hours * 60.0;
    let drainer =
        invocations * (lambda_req + o.drainer_seconds * gb(o.drainer_memory_mb) * lambda_s);
    let batches = o.units.div_ceil(o.batch.max(1)) as f64;
    let data_api = p("data_api_per_million_requests")? / million;
    let ecpu = p("elasticache_serverless_valkey_per_million_ecpu")? / million;
    let storage = p("elasticache_serverless_valkey_min_gb")?
        * o.hours
        * p("elasticache_serverless_valkey_per_gb_hour")?;
    let aurora = o.min_acu * o.hours * p("aurora_serverless_v2_per_acu_hour")?;
    let mut lines = vec![
        Line {
            service: "API Gateway (HTTP API)",
            what: format!("{} requests", o.attempts),
            ours_usd: a * p("api_gateway_http_per_million_requests")? / million,
            tutorial_usd: a * p("api_gateway_http_per_million_requests")? / million,
        },
        Line {
            service: "Lambda seckill-http",
            what: format!(
                "{} invocations x {http_billed_ms} ms (tutorial {tutorial_billed_ms} ms) at {} MB",
                o.attempts, o.http_memory_mb
            ),
            ours_usd: http(http_billed_ms),
            tutorial_usd: http(tutorial_billed_ms),
        },
        Line {
            service: "ElastiCache Serverless (Valkey)",
            what: format!(
                "{:.1} ECPU x {} attempts; {} GB stored for {} h",
                o.ecpu_per_attempt,
                o.attempts,
                p("elasticache_serverless_valkey_min_gb")?,
                o.hours
            ),
            ours_usd: a * o.ecpu_per_attempt * ecpu + storage,
            // The tutorial design gates with Redis too (its admission script).
            tutorial_usd: a * o.ecpu_per_attempt * ecpu + storage,
        },
        Line {
            service: "Lambda order-drainer",
            what: format!(
                "{invocations:.0} scheduled runs x {} s at {} MB (tutorial: none)",
                o.drainer_seconds, o.drainer_memory_mb
            ),
            ours_usd: drainer,
            tutorial_usd: 0.0,
        },
        Line {
            service: "RDS Data API",
            what: format!(
                "{batches:.0} batches x {} requests (tutorial: {} per attempt)",
                o.data_api_per_batch, o.tutorial_data_api
            ),
            ours_usd: batches * o.data_api_per_batch * data_api,
            tutorial_usd: a * o.tutorial_data_api * data_api,
        },
        Line {
            service: "Aurora Serverless v2",
            what: format!(
                "{} ACU x {} h, the floor (the tutorial design's transaction per attempt would scale it up: not counted)",
                o.min_acu, o.hours
            ),
            ours_usd: aurora,
            tutorial_usd: aurora,
        },
    ];
    lines.extend(events(o, &p)?);
    if o.stripe {
        let units = o.units as f64;
        // Checkout creates one PaymentIntent per order paid (a second checkout reads
        // it: counted as one more); a refund looks for one, then asks: two calls.
        let refunds = units * o.refunds_per_100 / 100.0;
        let calls = units * 2.0 + refunds * 2.0;
        let nat_gb = calls * o.stripe_call_kb / 1e6;
        let nat = o.hours * p("nat_gateway_per_hour")? + nat_gb * p("nat_gateway_per_gb")?;
        lines.push(Line {
            service: "NAT gateway (Stripe)",
            what: format!(
                "1 gateway x {} h; {calls:.0} Stripe calls x {} KB = {nat_gb:.3} GB",
                o.hours, o.stripe_call_kb
            ),
            ours_usd: nat,
            tutorial_usd: nat,
        });
        // One success per unit sold, and one charge.refunded per refund, each a request
        // and a 1 ms invocation.
        let events = units + refunds;
        let event_usd = events
            * (p("api_gateway_http_per_million_requests")? / million
                + lambda_req
                + 0.001 * gb(o.http_memory_mb) * lambda_s);
        lines.push(Line {
            service: "Stripe's events (API Gateway, Lambda)",
            what: format!("{events:.0} events"),
            ours_usd: event_usd,
            tutorial_usd: event_usd,
        });
        let secrets = 2.0 * p("secrets_manager_per_secret_month")? * o.hours / 730.0;
        lines.push(Line {
            service: "Secrets Manager (Stripe)",
            what: format!("2 secrets x {} h", o.hours),
            ours_usd: secrets,
            tutorial_usd: secrets,
        });
    }
    lines.extend(reads_and_edge(o, &p)?);
    let prices = list
        .prices
        .iter()
        .map(|(name, p)| (name.clone(), p.value, p.unit.clone(), p.source.clone()))
        .collect();
    Ok(Bill {
        options: o.clone(),
        region: list.region,
        prices_checked: list.checked,
        lines,
        prices,
    })
}

/// The order events (EventBridge, billed per entry of up to 64 KB whatever the calls
/// carry; ours are under 1 KB) and the example consumer queue, the same in both
/// designs (the tutorial publishes none; a shop would need them alike).
fn events(o: &CostOptions, p: &dyn Fn(&str) -> anyhow::Result<f64>) -> anyhow::Result<Vec<Line>> {
    let units = o.units as f64;
    let refunds = if o.stripe {
        units * o.refunds_per_100 / 100.0
    } else {
        0.0
    };
    let events = units * o.events_per_order + 3.0 * refunds;
    let bus = events * p("eventbridge_per_million_events")? / 1e6;
    let queue = events * o.queue_requests_per_event * p("sqs_per_million_requests")? / 1e6;
    Ok(vec![
        Line {
            service: "EventBridge (order events)",
            what: format!("{events:.0} events ({} per unit sold)", o.events_per_order),
            ours_usd: bus,
            tutorial_usd: bus,
        },
        Line {
            service: "SQS (example consumer queue)",
            what: format!("{:.0} requests", events * o.queue_requests_per_event),
            ours_usd: queue,
            tutorial_usd: queue,
        },
    ])
}

/// The anonymous reads (`--cost-page-reads`) and the edge (`--cost-edge`), the same in
/// both designs. Without the edge every read is a request and an invocation. With it,
/// every request (attempts and reads) pays CloudFront and WAF, and a read reaches the
/// API only when an edge location's copy is older than its second: at most two objects
/// (the voucher's answer, a page file) per location and second.
fn reads_and_edge(
    o: &CostOptions,
    p: &dyn Fn(&str) -> anyhow::Result<f64>,
) -> anyhow::Result<Vec<Line>> {
    let million = 1e6;
    let per_call = p("api_gateway_http_per_million_requests")? / million
        + p("lambda_per_million_requests")? / million
        + 0.001 * o.http_memory_mb / 1024.0 * p("lambda_arm64_per_gb_second")?;
    let reads = o.page_reads as f64;
    let mut lines = Vec::new();
    let reaching = if o.edge {
        reads.min(2.0 * o.edge_locations * o.read_seconds)
    } else {
        reads
    };
    if reads > 0.0 {
        let line = |usd| Line {
            service: "Anonymous reads (API Gateway, Lambda)",
            what: format!("{reaching:.0} of {reads:.0} reads reach the API"),
            ours_usd: usd,
            tutorial_usd: usd,
        };
        lines.push(line(reaching * per_call));
    }
    if !o.edge {
        return Ok(lines);
    }
    let requests = o.attempts as f64 + reads;
    let out_gb = requests * o.response_kb / 1024.0 / 1024.0;
    let cloudfront = requests * p("cloudfront_https_per_million_requests")? / million
        + out_gb * p("cloudfront_out_per_gb")?;
    lines.push(Line {
        service: "CloudFront (edge)",
        what: format!("{requests:.0} HTTPS requests, {out_gb:.2} GB out"),
        ours_usd: cloudfront,
        tutorial_usd: cloudfront,
    });
    // The web ACL and its four rules (two per-client limits, two managed groups), billed
    // monthly, attributed for the hours; every request inspected.
    let month = o.hours / 730.0;
    let waf = (p("waf_web_acl_per_month")? + 4.0 * p("waf_rule_per_month")?) * month
        + requests * p("waf_per_million_requests")? / million
        + p("secrets_manager_per_secret_month")? * month;
    lines.push(Line {
        service: "AWS WAF, origin secret (edge)",
        what: format!(
            "1 web ACL, 4 rules, 1 secret x {} h; {requests:.0} requests",
            o.hours
        ),
        ours_usd: waf,
        tutorial_usd: waf,
    });
    Ok(lines)
}

/// The bill as a Markdown table, with its sale and the price list's date.
pub fn markdown(b: &Bill) -> String {
    use std::fmt::Write as _;
    let o = &b.options;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "A sale of {} units, {} attempts by {} users, infrastructure attributed for {} h ({} prices, {}):\n",
        o.units, o.attempts, o.users, o.hours, b.region, b.prices_checked
    );
    s.push_str("| service | what | ours (USD) | tutorial design (USD) |\n|---|---|---:|---:|\n");
    for l in &b.lines {
        let _ = writeln!(
            s,
            "| {} | {} | {:.4} | {:.4} |",
            l.service, l.what, l.ours_usd, l.tutorial_usd
        );
    }
    let (ours, tutorial) = b.total();
    let _ = writeln!(s, "| **total** | | **{ours:.4}** | **{tutorial:.4}** |");
    let _ = writeln!(
        s,
        "\nPer 1,000 attempts: ours {:.5} USD, the tutorial design {:.5} USD.",
        ours / o.attempts as f64 * 1000.0,
        tutorial / o.attempts as f64 * 1000.0
    );
    s.push_str("\nPrices used:\n\n");
    for (name, value, unit, source) in &b.prices {
        let _ = writeln!(s, "- `{name}`: {value} {unit} ({source})");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        cost: CostOptions,
    }

    #[test]
    fn the_shipped_price_list_parses_and_names_a_source_for_every_price() {
        let list: PriceList = serde_json::from_str(PRICES).unwrap();
        assert!(list.prices.len() >= 8);
        for (name, p) in &list.prices {
            assert!(p.source.starts_with("https://aws.amazon.com/"), "{name}");
            assert!(p.value > 0.0 && !p.unit.is_empty(), "{name}");
        }
    }

    #[test]
    fn a_sale_s_bill_adds_up_from_its_parts() {
        let o = Cli::parse_from(["cost"]).cost;
        let b = bill(&o).unwrap();
        let (ours, tutorial) = b.total();
        // A million requests through API Gateway alone cost 1 USD.
        let gateway = &b.lines[0];
        assert!((gateway.ours_usd - 1.0).abs() < 1e-9);
        // Lambda: a million 1 ms invocations at 512 MB: 0.2 + 1e6 x 0.001 x 0.5 x price.
        let lambda = &b.lines[1];
        let want = 0.2 + 1e6 * 0.001 * 0.5 * 0.0000133334;
        assert!((lambda.ours_usd - want).abs() < 1e-9, "{lambda:?}");
        // The tutorial design pays a Data API transaction per attempt.
        assert!(b.lines[4].tutorial_usd > 100.0 * b.lines[4].ours_usd);
        assert!(tutorial > ours, "{b:?}");
        let page = markdown(&b);
        assert!(page.contains("| **total** |"), "{page}");
    }

    #[test]
    fn the_edge_prices_every_request_and_keeps_reads_from_the_api() {
        let line = |b: &Bill, name: &str| {
            b.lines
                .iter()
                .find(|l| l.service.starts_with(name))
                .map(|l| l.ours_usd)
        };
        let plain = bill(&Cli::parse_from(["cost"]).cost).unwrap();
        assert_eq!(
            line(&plain, "Anonymous reads"),
            None,
            "not counted unless asked"
        );
        assert_eq!(line(&plain, "CloudFront"), None);
        let reads = ["cost", "--cost-page-reads", "6000000"];
        let direct = bill(&Cli::parse_from(reads).cost).unwrap();
        let per_call = 1.0 / 1e6 + 0.2 / 1e6 + 0.001 * 0.5 * 0.0000133334;
        let all = line(&direct, "Anonymous reads").unwrap();
        assert!((all - 6e6 * per_call).abs() < 1e-6, "{all}");
        let edge = bill(&Cli::parse_from([&reads[..], &["--cost-edge"]].concat()).cost).unwrap();
        // 40 locations x 600 s x 2 objects reach the API, of 6,000,000.
        let kept = line(&edge, "Anonymous reads").unwrap();
        assert!((kept - 48_000.0 * per_call).abs() < 1e-6, "{kept}");
        // CloudFront and WAF see the attempts and the reads: 7 million requests.
        let cloudfront = line(&edge, "CloudFront").unwrap();
        let out_gb = 7e6 / 1024.0 / 1024.0;
        assert!(
            (cloudfront - (7.0 + out_gb * 0.085)).abs() < 1e-6,
            "{cloudfront}"
        );
        let waf = line(&edge, "AWS WAF").unwrap();
        assert!(
            (waf - (9.0 / 730.0 + 7.0 * 0.6 + 0.4 / 730.0)).abs() < 1e-6,
            "{waf}"
        );
    }

    #[test]
    fn a_million_orders_cost_less_in_events_than_in_admissions_without_a_payment_step() {
        let line = |b: &Bill, name: &str| {
            b.lines
                .iter()
                .find(|l| l.service.starts_with(name))
                .map(|l| l.ours_usd)
                .unwrap()
        };
        let args = [
            "cost",
            "--cost-units",
            "1000000",
            "--cost-attempts",
            "1000000",
        ];
        let b = bill(&Cli::parse_from(args).cost).unwrap();
        let admissions = line(&b, "API Gateway") + line(&b, "Lambda seckill-http");
        let events = line(&b, "EventBridge");
        assert!((events - 1.0).abs() < 1e-9, "one event a unit: {events}");
        assert!(events < admissions, "{events} >= {admissions}");
        // With a payment step, two events a unit: more than the admission alone.
        let paying =
            bill(&Cli::parse_from([&args[..], &["--events-per-order", "2"]].concat()).cost)
                .unwrap();
        assert!((line(&paying, "EventBridge") - 2.0).abs() < 1e-9);
    }

    #[test]
    fn stripe_adds_a_nat_gateway_its_data_and_the_events() {
        let plain = bill(&Cli::parse_from(["cost"]).cost).unwrap();
        let o = Cli::parse_from(["cost", "--cost-stripe", "--cost-units", "100000"]).cost;
        let b = bill(&o).unwrap();
        assert_eq!(b.lines.len(), plain.lines.len() + 3);
        let nat = &b.lines[plain.lines.len()];
        // One hour of the gateway, and 204,000 calls x 4 KB = 0.816 GB at 0.045.
        let want = 0.045 + 204_000.0 * 4.0 / 1e6 * 0.045;
        assert!((nat.ours_usd - want).abs() < 1e-9, "{nat:?}");
        assert_eq!(nat.ours_usd, nat.tutorial_usd);
    }
}
