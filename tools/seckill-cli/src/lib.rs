//! The operator commands' logic, as library functions the `seckill` binary (a thin
//! layer: arguments and printing) and the tests call.

pub mod ops;
