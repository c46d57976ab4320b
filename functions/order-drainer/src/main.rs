//! order-drainer entry point.
//!
//! - as a Lambda function (default): builds the clients once, then serves EventBridge
//!   scheduled events (any JSON is accepted: the event carries no input) with
//!   [`order_drainer::handle`];
//! - `order-drainer --once`: one drain cycle without the Lambda runtime, for operators
//!   and crash tests; prints the summary JSON on stdout, exits 1 when the cycle had
//!   errors, 2 on bad configuration.
//!
//! A failed invocation meets Lambda here and only here: [`diagnostic`] turns the
//! handler's [`DrainError`] into the `Diagnostic` the runtime reports.

use lambda_runtime::{Diagnostic, Error, LambdaEvent, run, service_fn};
use order_drainer::{Config, DrainError, Drainer, handle, run_once};
use serde_json::Value;

const USAGE: &str = "usage: order-drainer [--once]\n\
  (no argument)  run as an AWS Lambda function (EventBridge schedule)\n\
  --once         drain once (DRAINER_MAX_RUN_MS), print the summary JSON, exit";

#[tokio::main]
async fn main() -> Result<(), Error> {
    seckill_shared::telemetry::init();
    seckill_shared::metrics::install_from_env();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let once = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => false,
        ["--once"] => true,
        ["-h" | "--help"] => {
            println!("{USAGE}");
            return Ok(());
        }
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) if once => {
            eprintln!("{e}");
            std::process::exit(2);
        }
        Err(e) => {
            tracing::error!(error = %e, "bad configuration");
            return Err(e.into());
        }
    };
    let drainer: &'static Drainer = Box::leak(Box::new(Drainer::connect(config).await?));

    if once {
        let (summary, ok) = run_once(drainer).await;
        println!("{}", serde_json::to_string(&summary)?);
        std::process::exit(if ok { 0 } else { 1 });
    }

    run(service_fn(move |event: LambdaEvent<Value>| async move {
        handle(
            drainer,
            &event.context.request_id,
            event.context.deadline,
            &event.payload,
        )
        .await
        .map_err(diagnostic)
    }))
    .await
}

/// What Lambda records of a failed invocation (the scheduler's error metric and the
/// drainer's errors alarm count it): the error's kind as `errorType`, so failures can be
/// told apart without parsing text, and its message (the summary's error count and first
/// error) as `errorMessage`. The summary itself was logged by the run.
fn diagnostic(err: DrainError) -> Diagnostic {
    let kind = match &err {
        DrainError::Store { .. } => "Store",
        DrainError::Raced { .. } => "Raced",
        DrainError::Incomplete { .. } => "Incomplete",
    };
    Diagnostic {
        error_type: format!("DrainError::{kind}"),
        error_message: err.to_string(),
    }
}
