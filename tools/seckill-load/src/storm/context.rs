//! One storm's context, shared by its buyers, its faults and its ledger check: the
//! options, the sale's voucher and price, the buyers' HTTP client, and the stack's
//! backends as the operators' commands connect.

use seckill_cli::ops::Backends;

use super::client::Shop;
use super::plan::StormOptions;

/// One storm's context, shared by its buyers.
pub struct Storm {
    pub opts: StormOptions,
    pub voucher: String,
    pub price: Option<i64>,
    pub shop: Shop,
    pub backends: Backends,
    pub mysql: mysql_async::Pool,
}
