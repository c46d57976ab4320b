//! Lambda entry point: build the clients once, then serve requests.

use lambda_http::{Error, Request, run, service_fn};
use seckill_http::{App, Config, handle};

#[tokio::main]
async fn main() -> Result<(), Error> {
    seckill_shared::telemetry::init();
    seckill_shared::metrics::install_from_env();
    let config = Config::from_env()?;
    let app: &'static App = Box::leak(Box::new(App::new(&config).await));
    run(service_fn(move |req: Request| async move {
        Ok::<_, Error>(handle(app, req).await)
    }))
    .await
}
