//! seckill-load: the load tool and benchmarks of the seckill engine.
//!
//! It drives the real seckill-http handler in this process (the engine, not an
//! emulator) and measures it in the same run, on the same Redis and with the same
//! callers, against baselines written from the widely copied Redis "seckill" tutorial and
//! against the floor of what a round trip costs. Every run checks the sale's invariants
//! and fails loudly when one breaks. (A sale over HTTP against a running stack is `seckill
//! demo`.)

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
