//! seckill-load: the load tool and benchmarks of the seckill engine.
//!
//! It drives the real seckill-http handler in this process (the engine, not an
//! emulator) and measures it in the same run, on the same Redis and with the same
//! callers, against baselines written from the widely copied Redis "seckill" tutorial and
//! against the floor of what a round trip costs. Every run checks the sale's invariants
//! and fails loudly when one breaks. (A sale over HTTP against a running stack is `seckill
//! demo`.)
//!
//! - [`backends`]: a fresh database and unique Redis keys per run, cleaned up after;
//! - [`workload`]: who attempts when, and their tokens;
//! - [`drivers`]: one caller each of ours (in process, or without the handler), the
//!   tutorial, the floor;
//! - [`engine`]: runs callers concurrently with a progress bar;
//! - [`record`]: per-caller records, merged results, latency percentiles, timelines;
//! - [`admission`]: the `sale` and `admit` scenarios and their invariant checks;
//! - [`drain`]: the `drain` scenario and admission-to-commit latency;
//! - [`footprint`]: peak memory of the release binaries under a local Lambda runtime API;
//! - [`report`]: the JSON results, the ratio table and the machine it ran on;
//! - [`svg`]: the sale's timeline chart.

pub mod admission;
pub mod backends;
pub mod drain;
pub mod drivers;
pub mod engine;
pub mod footprint;
pub mod record;
pub mod report;
pub mod svg;
pub mod workload;
