//! The library behind the `seckill` command, so the tests run exactly what the command
//! does: [`migrate`] (`seckill migrate`) and [`ops`], the operator commands (`seckill
//! status`, `dead-letters`, `reconcile`); the binary is a thin layer of arguments and
//! printing. [`stack_env`] is the one reader of the local stack's `.dev/stack.env`, and
//! [`scratch_db`] makes the databases of one's own on its MariaDB, both also used by the
//! load tool and the test fixtures.

pub mod migrate;
pub mod ops;
pub mod scratch_db;
pub mod stack_env;
