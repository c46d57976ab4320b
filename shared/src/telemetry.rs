//! Logging setup: JSON lines in Lambda (CloudWatch parses them), compact text locally.
//!
//! The level comes from `RUST_LOG` (default `info`). Tokens, secrets and request bodies
//! are never logged by this crate or the functions.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls are no-ops.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // The template sets the function's LoggingConfig to JSON, and Lambda then exports
    // AWS_LAMBDA_LOG_FORMAT=JSON.
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("JSON"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        // Lambda adds its own timestamp and request id to each line.
        builder
            .json()
            .with_current_span(true)
            .without_time()
            .with_target(false)
            .try_init()
    } else {
        builder.compact().try_init()
    };
}
