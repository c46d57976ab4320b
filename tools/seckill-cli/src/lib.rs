//! The library behind the `seckill` command, for what the tests run exactly as the
//! command does: [`migrate`], `seckill migrate`.

pub mod migrate;
