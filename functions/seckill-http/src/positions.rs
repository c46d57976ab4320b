//! Waiting-room positions written to the database before a join is answered
//! (`crate::queue`), as a group commit: the joins of one instance that arrive while a
//! write is under way go together in the next statement, so a crowd joining through a
//! busy instance costs a few Data API calls, not one each, and no join waits for more
//! than the write before its own. A Lambda instance serves one request at a time (then
//! every write is a single row, at once); the local emulator and the tests serve many.

use std::sync::{Arc, Mutex};

use seckill_shared::adapters::data_api::DataApi;
use seckill_shared::domain::{UserId, VoucherId};
use seckill_shared::error::StoreError;
use tokio::sync::oneshot;

/// Rows one statement writes at most (three parameters each, well inside the Data
/// API's limits).
const MOST_ROWS: usize = 300;

type Waiter = oneshot::Sender<Result<(), String>>;

#[derive(Default)]
struct Pending {
    rows: Vec<(VoucherId, UserId, u64)>,
    waiters: Vec<Waiter>,
    /// A task is writing (and will write what gathers meanwhile).
    writing: bool,
}

/// One instance's writer of positions.
#[derive(Default, Clone)]
pub(crate) struct PositionWriter {
    pending: Arc<Mutex<Pending>>,
}

impl PositionWriter {
    /// Writes (voucher, user, position) and returns once it is in the database, or why
    /// not (`503`: the join is answered only once its place is kept).
    pub(crate) async fn record(
        &self,
        db: &DataApi,
        voucher: VoucherId,
        user: &UserId,
        position: u64,
    ) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut p = self.pending.lock().expect("positions");
            p.rows.push((voucher, user.clone(), position));
            p.waiters.push(tx);
            !std::mem::replace(&mut p.writing, true)
        };
        if start {
            tokio::spawn(self.clone().write_all(db.clone()));
        }
        let unavailable = |detail: String| StoreError::Unavailable {
            backend: "data api",
            detail,
        };
        match rx.await {
            Ok(result) => result.map_err(unavailable),
            Err(_) => Err(unavailable("the position's write was dropped".into())),
        }
    }

    /// Writes what is pending, batch after batch, until nothing is.
    async fn write_all(self, db: DataApi) {
        loop {
            let (rows, waiters) = {
                let mut p = self.pending.lock().expect("positions");
                if p.rows.is_empty() {
                    p.writing = false;
                    return;
                }
                let n = p.rows.len().min(MOST_ROWS);
                let rows: Vec<_> = p.rows.drain(..n).collect();
                let waiters: Vec<_> = p.waiters.drain(..n).collect();
                (rows, waiters)
            };
            let result = db.record_positions(&rows).await.map_err(|e| e.to_string());
            for w in waiters {
                let _ = w.send(result.clone());
            }
        }
    }
}
