//! The library behind the `seckill` command, so the tests run exactly what it does:
//! [`migrate`] and the operator commands [`ops`]; also [`stack_env`], the one reader of
//! `.dev/stack.env`, and [`scratch_db`], both used by the load tool and the test fixtures.

pub mod migrate;
pub mod ops;
pub mod scratch_db;
pub mod stack_env;
