//! order-drainer.
