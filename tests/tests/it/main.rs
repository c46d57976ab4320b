//! The integration suites, as one test binary: one link instead of one per suite, and
//! one place to look. Each module is a suite against real parts (private Redis servers
//! and clusters, the local stack's MariaDB and Data API, `cargo lambda watch`); the
//! shared fixtures are in the `seckill_tests` library (`tests/src`).
//!
//! A test's name starts with its suite, so a suite runs alone with a filter:
//! `cargo test -p seckill-tests --test it -- drainer_flow::` (several filters select
//! the union; `scripts/test.sh` runs the cluster pass that way).
//!
//! `metrics_emf` stays a binary of its own (`tests/tests/metrics_emf.rs`): it installs
//! the process-wide metrics recorder, which would turn the metrics on for every handler
//! test in this process and mix their counts into its own.

mod admission_lua;
mod app_user;
mod browser;
mod browser_stripe;
mod buckets;
mod cluster_topology;
mod contract;
mod contract_fuzz;
mod data_api;
mod drainer_crash;
mod drainer_e2e;
mod drainer_flow;
mod e2e_http;
mod edge;
mod fairness;
mod http_fuzz;
mod http_handlers;
mod live_view;
mod ops_cli;
mod order_events;
mod payment;
mod redis_fixture;
mod repair;
mod repository;
mod room_line;
mod small_sales;
mod stack_rerun;
mod stack_smoke;
mod stale_truths;
mod storm;
mod stripe;
mod template;
mod waiting_room;
