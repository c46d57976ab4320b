//! seckill-load: the load tool and benchmarks of the seckill engine. It drives the real
//! seckill-http handler in process and measures it in the same run, on the same Redis and
//! callers, against baselines from the widely copied Redis "seckill" tutorial and against
//! the floor of a round trip, checking the sale's invariants after every run.

pub mod admission;
pub mod backends;
pub mod buckets;
pub mod cost;
pub mod drain;
pub mod drivers;
pub mod engine;
pub mod fairness;
pub mod figures;
pub mod flood;
pub mod footprint;
pub mod pinning;
pub mod record;
pub mod redis_info;
pub mod report;
pub mod rush;
pub mod storm;
pub mod svg;
pub mod workload;
