//! Many commands of many slots in one pipeline, where one node serves every slot
//! ([`RedisConn::pipelined`]).
//!
//! A drain of thousands of small sales probes each sale once and acks it once, every
//! command on its own slot. Sent one by one, every command pays a request's work on both
//! sides: the cluster client's routing and a request of its own on the node's
//! connection, a reply read and parsed alone, a wake-up of the caller. Where one node
//! serves every slot (ElastiCache Serverless's one endpoint, a single node, the local
//! stack) they travel as pipelines instead: a node serves every slot it owns on one
//! connection, so commands of different slots need not be sent apart.
//!
//! On a cluster of several primaries every command is still sent alone. The cluster
//! client answers a redirection met by any command of a pipeline (a slot moved since it
//! last read the cluster's map) by sending the *whole* pipeline again to the node it
//! names, and on until its retries run out: commands that had run may run again, their
//! first answers lost. An XACK would shrug that off; a probe, which reads new entries
//! for the drain group, would leave them pending, unseen, until a later claim. Grouping
//! by node with a slot map of our own, and sending only what is safe twice that way,
//! is left for when a node-based cluster's drain needs it.
//!
//! Invariants kept here:
//! - every command ends with its own answer: one that came back as an error saying it
//!   did not run (its slot served elsewhere or migrating, the script not loaded) is sent
//!   again alone, through the caller's own form of it, which follows redirections,
//!   waits out a split slot, replaces a stuck client and loads a missing script;
//! - a pipeline that failed as a whole (a lost connection, no reply in time) leaves each
//!   command sent again alone only when it may run twice ([`AfterFailure`]);
//! - whether one node serves every slot is read with `CLUSTER SLOTS` when first needed
//!   and read again after a pipeline met a redirection (a node was added).

use futures::StreamExt;
use redis::aio::ConnectionLike;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, RedisResult, Value};

use super::cluster::Cluster;
use super::conn::RedisConn;
use super::redirect::Request;
use crate::keys::slots::SLOTS;

/// Commands per pipeline at most: a drain round of small sales (at most a few thousand)
/// in a few pipelines, none so large that its reply holds up the node's other callers
/// for long.
pub const MAX_PER_PIPELINE: usize = 1_000;

/// Commands sent again alone at once.
const ALONE_IN_FLIGHT: usize = 64;

/// How many primaries serve slots, read from a `CLUSTER SLOTS` reply:
/// `[[start, end, [host, port, ...], replicas...], ...]`. `None` when the reply is not of
/// that shape.
fn primaries_in(reply: &Value) -> Option<usize> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut nodes: Vec<(Vec<u8>, i64)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        if !(0..SLOTS as i64).contains(start) || !(*start..SLOTS as i64).contains(end) {
            return None;
        }
        let host = match primary.first() {
            Some(Value::BulkString(h)) => h.clone(),
            Some(Value::SimpleString(h)) => h.clone().into_bytes(),
            _ => return None,
        };
        let Some(Value::Int(port)) = primary.get(1) else {
            return None;
        };
        if !nodes.contains(&(host.clone(), *port)) {
            nodes.push((host, *port));
        }
    }
    Some(nodes.len())
}

/// `n` commands' indices cut into pipelines of at most [`MAX_PER_PIPELINE`], in order.
fn pipelines(n: usize) -> Vec<Vec<usize>> {
    (0..n)
        .collect::<Vec<_>>()
        .chunks(MAX_PER_PIPELINE)
        .map(<[usize]>::to_vec)
        .collect()
}

/// Whether an answer in a pipeline says that the command's slot is served elsewhere now
/// (the map is stale).
fn redirection(value: &Value) -> bool {
    use redis::ServerErrorKind::{Ask, Moved};
    matches!(value, Value::ServerError(e) if matches!(e.kind(), Some(Moved | Ask)))
}

/// Whether an error reply in a pipeline says that the command did not run: its slot is
/// served elsewhere or split between two nodes, the cluster or the node is not ready,
/// or the script is not loaded there yet. Such a command is sent again alone; any other
/// error reply is its answer, as it would be alone.
fn did_not_run(value: &Value) -> bool {
    use redis::ServerErrorKind::{
        Ask, BusyLoading, ClusterDown, MasterDown, Moved, NoScript, TryAgain,
    };
    matches!(value, Value::ServerError(e) if matches!(
        e.kind(),
        Some(Moved | Ask | TryAgain | ClusterDown | BusyLoading | MasterDown | NoScript)
    ))
}

/// What becomes of the commands of a pipeline that failed as a whole (a lost
/// connection, no reply in time), any of which may or may not have run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Each is sent again alone: it may run twice (an XACK).
    SendAlone,
    /// Each answers with the failure, as it would have alone: a second copy would do
    /// harm, or nothing the caller needs (a read for a group: entries the first copy
    /// read wait, pending, for a later claim).
    Fail,
}

impl RedisConn {
    /// Sends `cmds` as pipelines where one node serves every slot, else each alone (see
    /// the module header); returns each command's answer, in order, an error reply as an
    /// `Err`. A command whose pipeline said it did not run
    /// is sent again through `alone(i)` (its index in `cmds`: the form the caller sends
    /// one command in, which follows redirections and loads a missing script); one whose
    /// pipeline failed as a whole too when `after_failure` says so.
    pub async fn pipelined<F, Fut>(
        &self,
        cmds: &[Cmd],
        after_failure: AfterFailure,
        alone: F,
    ) -> Vec<RedisResult<Value>>
    where
        F: Fn(usize) -> Fut,
        Fut: std::future::Future<Output = RedisResult<Value>>,
    {
        let mut answers: Vec<Option<RedisResult<Value>>> = (0..cmds.len()).map(|_| None).collect();
        let groups = match self {
            RedisConn::Single(_) => pipelines(cmds.len()),
            RedisConn::Cluster(c) => match c.one_primary().await {
                Some(true) => pipelines(cmds.len()),
                // Several primaries, or unknown: each alone (see the module header).
                _ => Vec::new(),
            },
        };
        let sent = futures::future::join_all(groups.into_iter().map(|group| async move {
            let answer = self.pipeline(cmds, &group).await;
            (group, answer)
        }))
        .await;
        let mut stale = false;
        for (group, answer) in sent {
            let values = match answer {
                Ok(values) if values.len() == group.len() => values,
                failed => {
                    let e = failed.map_or_else(
                        |e| e,
                        |values| {
                            redis::RedisError::from((
                                redis::ErrorKind::Client,
                                "a pipeline's reply did not match its commands",
                                format!("{} replies to {} commands", values.len(), group.len()),
                            ))
                        },
                    );
                    // The cluster client gave up following a redirection for it.
                    stale |= matches!(
                        e.kind(),
                        redis::ErrorKind::Server(
                            redis::ServerErrorKind::Moved | redis::ServerErrorKind::Ask
                        )
                    );
                    if after_failure == AfterFailure::Fail {
                        for &i in &group {
                            answers[i] = Some(Err(e.clone()));
                        }
                    }
                    continue;
                }
            };
            for (i, value) in group.into_iter().zip(values) {
                stale |= redirection(&value);
                if !did_not_run(&value) {
                    answers[i] = Some(value.extract_error());
                }
            }
        }
        if stale && let RedisConn::Cluster(c) = self {
            c.forget_primaries();
        }
        let unanswered: Vec<usize> = (0..cmds.len()).filter(|&i| answers[i].is_none()).collect();
        let alone = &alone;
        let again: Vec<(usize, RedisResult<Value>)> = futures::stream::iter(unanswered)
            .map(|i| async move { (i, alone(i).await.and_then(Value::extract_error)) })
            .buffer_unordered(ALONE_IN_FLIGHT)
            .collect()
            .await;
        for (i, answer) in again {
            answers[i] = Some(answer);
        }
        answers
            .into_iter()
            .map(|a| a.expect("every command was answered, in a pipeline or alone"))
            .collect()
    }

    /// One pipeline of the commands at `group`'s indices, to the one node.
    async fn pipeline(&self, cmds: &[Cmd], group: &[usize]) -> RedisResult<Vec<Value>> {
        let mut pipe = redis::pipe();
        for &i in group {
            pipe.add_command(cmds[i].clone());
        }
        match self {
            RedisConn::Single(c) => c.clone().req_packed_commands(&pipe, 0, group.len()).await,
            RedisConn::Cluster(c) => {
                // Any slot's route reaches the one node.
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(0, SlotAddr::Master));
                c.current()
                    .1
                    .route_pipeline(pipe, 0, group.len(), route)
                    .await
            }
        }
    }
}

impl Cluster {
    /// Whether one node serves every slot, read with `CLUSTER SLOTS` when not known;
    /// `None` when it cannot be read (every command is then sent alone).
    async fn one_primary(&self) -> Option<bool> {
        if let Some(n) = *self.primaries.read().unwrap_or_else(|e| e.into_inner()) {
            return Some(n == 1);
        }
        let mut ask = redis::cmd("CLUSTER");
        ask.arg("SLOTS");
        let reply = self.request(Request::Command(&ask)).await.ok()?;
        let n = primaries_in(&reply)?;
        *self.primaries.write().unwrap_or_else(|e| e.into_inner()) = Some(n);
        Some(n == 1)
    }

    /// Forgets what `CLUSTER SLOTS` said: the next call reads it afresh.
    fn forget_primaries(&self) {
        *self.primaries.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    fn range(start: i64, end: i64, primary: Value) -> Value {
        Value::Array(vec![Value::Int(start), Value::Int(end), primary])
    }

    #[test]
    fn the_primaries_serving_slots_are_counted_once_each() {
        let one = Value::Array(vec![range(0, 16383, node("10.0.0.1", 6379))]);
        assert_eq!(primaries_in(&one), Some(1));
        // One node serving two ranges is one node; two nodes are not.
        let split = Value::Array(vec![
            range(0, 99, node("10.0.0.1", 6379)),
            range(200, 16383, node("10.0.0.1", 6379)),
        ]);
        assert_eq!(primaries_in(&split), Some(1));
        let two = Value::Array(vec![
            range(0, 99, node("10.0.0.1", 6379)),
            range(100, 16383, node("10.0.0.2", 6379)),
        ]);
        assert_eq!(primaries_in(&two), Some(2));
        assert_eq!(primaries_in(&Value::Array(vec![])), Some(0));
    }

    #[test]
    fn commands_are_cut_into_pipelines_of_at_most_the_limit_in_order() {
        let cut = pipelines(MAX_PER_PIPELINE * 2 + 1);
        let sizes: Vec<usize> = cut.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![MAX_PER_PIPELINE, MAX_PER_PIPELINE, 1]);
        assert_eq!(
            cut.concat(),
            (0..MAX_PER_PIPELINE * 2 + 1).collect::<Vec<_>>()
        );
        assert!(pipelines(0).is_empty());
    }

    #[test]
    fn a_malformed_reply_is_refused() {
        assert!(primaries_in(&Value::Int(1)).is_none());
        assert!(primaries_in(&Value::Array(vec![range(9, 3, node("h", 1))])).is_none());
        assert!(primaries_in(&Value::Array(vec![range(0, 16384, node("h", 1))])).is_none());
        assert!(primaries_in(&Value::Array(vec![Value::Array(vec![Value::Int(0)])])).is_none());
    }
}
