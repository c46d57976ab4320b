//! The library behind the `seckill` command, so the tests run exactly what the command
//! does: [`migrate`] (`seckill migrate`) and [`ops`], the operator commands (`seckill
//! status`, `dead-letters`, `reconcile`); the binary is a thin layer of arguments and
//! printing.

pub mod migrate;
pub mod ops;
