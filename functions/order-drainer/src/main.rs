//! Lambda entry point (placeholder until the drain cycle lands).

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use serde_json::{Value, json};

#[tokio::main]
async fn main() -> Result<(), Error> {
    seckill_shared::telemetry::init();
    run(service_fn(|_event: LambdaEvent<Value>| async {
        Ok::<_, Error>(json!({}))
    }))
    .await
}
