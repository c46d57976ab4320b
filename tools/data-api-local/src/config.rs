//! The server's configuration: the MariaDB it fronts, the resource and secret ARNs it
//! accepts, and Aurora's timeouts, with the local stack's defaults.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::secrets;

pub const DEFAULT_RESOURCE_ARN: &str = "arn:aws:rds:us-east-1:000000000000:cluster:seckill-local";
pub const DEFAULT_SECRET_ARN: &str =
    "arn:aws:secretsmanager:us-east-1:000000000000:secret:seckill-local";

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `mysql://user:password@host:port/database`; the database is the default for
    /// requests that name none.
    pub mysql_url: String,
    pub resource_arn: String,
    /// The secret whose user is the one of `mysql_url` (the master secret).
    pub secret_arn: String,
    /// More secrets, each signing in as its own MariaDB user (an application user).
    pub secrets: Vec<secrets::SecretCredentials>,
    pub transaction_idle_timeout: Duration,
    pub statement_timeout: Duration,
    /// Answer a call on a transaction the server does not know as earlier versions of
    /// the Data API did: `400 BadRequestException` "Transaction <id> is not found",
    /// instead of `404 TransactionNotFoundException` (tests of clients that must take
    /// both forms for the same fact).
    pub not_found_as_bad_request: bool,
    /// Tests of what a client does when an answer is lost after the call took effect:
    /// the next calls [`LostAnswers`] names (statements whose SQL contains a text, or
    /// commits, or rollbacks) run, then are answered `503 ServiceUnavailableError` (as
    /// a proxy that gave up waiting answers, or a connection cut after the request went
    /// out), their effect kept: the statement's writes, the transaction committed or
    /// rolled back (and so no longer known to the server).
    pub lose_answers: Option<LostAnswers>,
    /// Faults set at run time through `POST /_local/faults` (`--fault-control`); `None`:
    /// no such route.
    pub faults: Option<Arc<crate::faults::Faults>>,
}

/// See [`ServerConfig::lose_answers`]: which calls lose their answer, `times` times in
/// all.
#[derive(Debug, Clone)]
pub struct LostAnswers {
    pub of: LostCall,
    left: Arc<AtomicUsize>,
}

/// The calls whose answers [`LostAnswers`] loses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LostCall {
    /// `ExecuteStatement` of an SQL text containing this one.
    Statement(String),
    /// `CommitTransaction`: the transaction is committed.
    Commit,
    /// `RollbackTransaction`: the transaction is rolled back.
    Rollback,
}

impl LostAnswers {
    /// The answers to statements whose SQL contains `sql`.
    pub fn new(sql: impl Into<String>, times: usize) -> Self {
        LostAnswers::of(LostCall::Statement(sql.into()), times)
    }

    /// The answers to calls of `of`.
    pub fn of(of: LostCall, times: usize) -> Self {
        LostAnswers {
            of,
            left: Arc::new(AtomicUsize::new(times)),
        }
    }

    /// Whether the answer to a statement of this SQL, which ran, is to be lost now.
    pub fn take(&self, sql: &str) -> bool {
        matches!(&self.of, LostCall::Statement(text) if sql.contains(text.as_str()))
            && self.count_one()
    }

    /// Whether the answer to this call ending a transaction (`Commit` or `Rollback`),
    /// which took effect, is to be lost now.
    pub fn take_end(&self, call: &LostCall) -> bool {
        self.of == *call && self.count_one()
    }

    fn count_one(&self) -> bool {
        self.left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// How many answers are still to be lost.
    pub fn left(&self) -> usize {
        self.left.load(Ordering::SeqCst)
    }
}

impl ServerConfig {
    /// The defaults of the local stack (`docs/design.md`) for the given MySQL URL.
    pub fn new(mysql_url: impl Into<String>) -> Self {
        ServerConfig {
            mysql_url: mysql_url.into(),
            resource_arn: DEFAULT_RESOURCE_ARN.to_string(),
            secret_arn: DEFAULT_SECRET_ARN.to_string(),
            secrets: Vec::new(),
            // Aurora rolls back a transaction after 3 minutes without a call, and cancels
            // a call after 45 seconds.
            transaction_idle_timeout: Duration::from_secs(180),
            statement_timeout: Duration::from_secs(45),
            not_found_as_bad_request: false,
            lose_answers: None,
            faults: None,
        }
    }
}
