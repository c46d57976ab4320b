//! `GET /status` (admin): the operators' live view of the sales, the same figures as
//! `seckill status` (`seckill_shared::sale_status`): stock left, admitted, orders
//! waiting to drain and how old the oldest is, dead letters, paid and expired orders.
//!
//! Read-only, admin-only and held to the admin's rate: an operator's page polls it
//! during a sale, so it must never cost the buyers anything but a few reads.

use http::StatusCode;
use lambda_http::{Body, Request, RequestExt, Response};
use seckill_shared::adapters::order_stream::OrderStreams;
use seckill_shared::domain::{UnixMillis, VoucherId, format_rfc3339_millis};
use seckill_shared::sale_status::SaleSources;
use serde_json::json;

use crate::app::App;
use crate::error::{ApiError, json_response};

/// Vouchers one request may name (`?voucher=1,2,3`), and shows without names.
pub const MAX_NAMED_VOUCHERS: usize = 50;

/// `GET /status[?voucher=ID,ID...]` (admin): the named vouchers (those that exist), or
/// the newest [`MAX_NAMED_VOUCHERS`] the drainer visits.
pub(crate) async fn status(
    app: &App,
    req: &Request,
    now: UnixMillis,
) -> Result<Response<Body>, ApiError> {
    let named = named_vouchers(req)?;
    let sales = app.sales().await?;
    let streams = OrderStreams::new(sales.conn());
    let sources = SaleSources {
        sales,
        streams: &streams,
        db: &app.db,
    };
    // Without names: the newest of the sales the drainer visits (ids grow with time),
    // so that a stack with thousands of small sales still answers in one poll's time.
    let ids = match named.is_empty() {
        false => named,
        true => sources.active(MAX_NAMED_VOUCHERS).await?,
    };
    let vouchers = sources.status(&ids).await?;
    let mut body = json!({
        "server_time": format_rfc3339_millis(now),
        "vouchers": vouchers,
    });
    // The order events owed (docs/design.md, "Order events"): left out when the outbox
    // cannot be read, the sales' figures are what this answer is for.
    match app.db.outbox_depth().await {
        Ok((owed, oldest)) => {
            body["events"] = json!({
                "owed": owed,
                "oldest_owed_ms": oldest.map(|at| (now - at).max(0)),
            });
        }
        Err(error) => tracing::warn!(%error, "outbox depth not read"),
    }
    Ok(json_response(StatusCode::OK, &body))
}

/// The `voucher` query parameter: decimal ids separated by commas (repeats allowed).
fn named_vouchers(req: &Request) -> Result<Vec<VoucherId>, ApiError> {
    let params = req.query_string_parameters_ref();
    let mut ids = Vec::new();
    for value in params.and_then(|p| p.all("voucher")).unwrap_or_default() {
        for part in value.split(',') {
            let id: VoucherId = part.trim().parse()?;
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    if ids.len() > MAX_NAMED_VOUCHERS {
        return Err(ApiError::InvalidRequest(format!(
            "at most {MAX_NAMED_VOUCHERS} vouchers at once, not {}",
            ids.len()
        )));
    }
    Ok(ids)
}
