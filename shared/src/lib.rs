//! seckill shared library.
