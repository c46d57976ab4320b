//! MOVED and ASK redirections the cluster client gave up on, finished by sending the
//! request straight to the node a redirection names.
//!
//! Invariant kept here: after an ASK, `ASKING` and the command travel in one pipeline
//! on the node's connection, so no other request's command can slip in between.

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, Value};

/// Rounds of redirection this adapter adds on top of the cluster client's own.
const ASK_ROUNDS: usize = 5;

/// A command or a pipeline (with the reply offset and count the caller wants).
#[derive(Clone, Copy)]
pub(super) enum Request<'a> {
    Command(&'a Cmd),
    Pipeline(&'a Pipeline, usize, usize),
}

/// Sends `request` through the cluster client and finishes the redirections it gave
/// up on, sending the request straight to the node each redirection names.
///
/// An ASK (the slot is migrating and this key already left) must reach the target
/// node right after an `ASKING` on the same connection. The client sends `ASKING` as a
/// request of its own on the node's multiplexed connection, so under concurrency
/// another request's command can slip in between: the target then answers MOVED back
/// to the source, which answers ASK again, until the client's retries run out (seen as
/// 503s while a slot moved). Here `ASKING` and the request travel as one pipeline, which
/// the connection writes contiguously. A MOVED the client gave up on is sent through
/// the client once more, then to the node it names: under load the client's slot map
/// was still the old one after its retries, and each round met the same MOVED (seen as
/// 503s in the slot-moving test while a failover test shared the CPU). A pipeline's
/// reply comes back as one array. (A node is reached by its address only if the client
/// already knows it: a brand-new node named by an ASK fails this way until the client's
/// slot map has it. Atomic pipelines cannot be redirected here; none are used.)
pub(super) async fn redirected(
    c: &mut ClusterConnection,
    request: Request<'_>,
) -> redis::RedisResult<Value> {
    let mut result = send(c, request, None).await;
    let mut moved_before = false;
    for _ in 0..ASK_ROUNDS {
        let Err(err) = &result else { break };
        let asking = match err.kind() {
            redis::ErrorKind::Server(redis::ServerErrorKind::Ask) => true,
            // The first time through the client, whose slot map is usually refreshed
            // by now (and which connects to a node it does not know yet).
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved) if !moved_before => {
                moved_before = true;
                result = send(c, request, None).await;
                continue;
            }
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => false,
            _ => break,
        };
        let Some((host, port)) = err
            .redirect_node()
            .and_then(|(addr, _slot)| addr.rsplit_once(':'))
            .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
        else {
            break;
        };
        result = send(c, request, Some(Redirect { host, port, asking })).await;
    }
    result
}

/// The node a MOVED or an ASK named, and whether it was an ASK.
struct Redirect {
    host: String,
    port: u16,
    asking: bool,
}

/// One attempt: routed by the client, or to the node `to` names (with `ASKING` in front
/// of each command after an ASK).
async fn send(
    c: &mut ClusterConnection,
    request: Request<'_>,
    to: Option<Redirect>,
) -> redis::RedisResult<Value> {
    use redis::cluster_routing::SingleNodeRoutingInfo;
    let Some(to) = to else {
        return match request {
            Request::Command(cmd) => c.req_packed_command(cmd).await,
            Request::Pipeline(p, offset, count) => c
                .req_packed_commands(p, offset, count)
                .await
                .map(Value::Array),
        };
    };
    // `ASKING` lets only the next command in: one in front of each.
    let mut p = redis::pipe();
    let mut add = |cmd: &Cmd| {
        if to.asking {
            p.cmd("ASKING");
        }
        p.add_command(cmd.clone());
    };
    let (offset, count) = match request {
        Request::Command(cmd) => {
            add(cmd);
            (0, 1)
        }
        Request::Pipeline(original, offset, count) => {
            original.cmd_iter().for_each(add);
            (offset, count)
        }
    };
    let n = p.len();
    let route = SingleNodeRoutingInfo::ByAddress {
        host: to.host,
        port: to.port,
    };
    let all = c.route_pipeline(p, 0, n, route).await?;
    // After an ASK every second reply is a command's; the others are the `ASKING`s' OKs.
    let (skip, step) = if to.asking { (1, 2) } else { (0, 1) };
    let mut replies: Vec<Value> = all
        .into_iter()
        .skip(skip)
        .step_by(step)
        .skip(offset)
        .take(count)
        .collect();
    // A MOVED or ASK met again comes back as an error, for the next round.
    match request {
        Request::Command(_) => replies.pop().unwrap_or(Value::Nil),
        Request::Pipeline(..) => Value::Array(replies),
    }
    .extract_error()
}
