//! The private Redis/Valkey of the tests (`seckill_tests::redis`) does what the other
//! suites rely on: `RedisServer::start` follows `SECKILL_REDIS_TOPOLOGY`, a cluster with
//! replicas fails over, `save` and `restart` keep exactly what was saved on every node,
//! and `ReplyDropper` loses a reply on whichever node the command reaches.

use std::time::Duration;

use redis::AsyncCommands;
use seckill_tests::redis::{RedisServer, RedisSettings, ReplyDropper, Role, Topology};

/// Keys with different hash tags until every primary of `redis` serves one.
fn keys_on_every_primary(redis: &RedisServer) -> Vec<String> {
    let primaries: Vec<u16> = redis
        .nodes()
        .into_iter()
        .filter(|n| n.role == Role::Primary)
        .map(|n| n.port)
        .collect();
    let mut keys: Vec<String> = Vec::new();
    let mut served = Vec::new();
    for i in 0.. {
        let key = format!("fixture:{{{i}}}:k");
        let port = redis.primary_of_slot(redis.key_slot(&key));
        if !served.contains(&port) {
            served.push(port);
            keys.push(key);
        }
        if served.len() == primaries.len() {
            break;
        }
    }
    keys
}

#[tokio::test]
async fn start_follows_the_topology_setting() {
    let redis = RedisServer::start();
    let nodes = redis.nodes();
    assert!(nodes.iter().all(|n| n.role == Role::Primary), "{nodes:?}");
    let owners =
        |slots: &[u16]| -> Vec<u16> { slots.iter().map(|s| redis.primary_of_slot(*s)).collect() };
    match RedisSettings::get().topology {
        Topology::Single => {
            assert_eq!(nodes.len(), 1);
            assert_eq!(owners(&[0, 8000, 16383]), [nodes[0].port; 3]);
        }
        Topology::Cluster => {
            assert_eq!(nodes.len(), 3);
            let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
            assert_eq!(owners(&[0, 5460]), [ports[0]; 2]);
            assert_eq!(owners(&[5461, 10922]), [ports[1]; 2]);
            assert_eq!(owners(&[10923, 16383]), [ports[2]; 2]);
        }
    }
    // Keys of one hash tag share a slot; the client routes to every node.
    assert_eq!(
        redis.key_slot("seckill:{42}:sale"),
        redis.key_slot("seckill:{42}:buyers")
    );
    let mut conn = redis.connect().await;
    for key in keys_on_every_primary(&redis) {
        let _: () = conn.set(&key, "v").await.unwrap();
        let got: String = conn.get(&key).await.unwrap();
        assert_eq!(got, "v");
    }
}

#[tokio::test]
async fn save_and_restart_keep_what_every_node_saved_and_nothing_else() {
    let mut redis = RedisServer::start();
    let keys = keys_on_every_primary(&redis);
    let mut conn = redis.connect().await;
    for key in &keys {
        let _: () = conn.set(key, "saved").await.unwrap();
    }
    redis.save();
    for key in &keys {
        let _: () = conn.set(key, "lost").await.unwrap();
        let _: () = conn.set(format!("{key}:new"), "lost").await.unwrap();
    }
    drop(conn);
    redis.restart();
    let mut conn = redis.connect().await;
    for key in &keys {
        let got: Option<String> = conn.get(key).await.unwrap();
        assert_eq!(got.as_deref(), Some("saved"), "{key}");
        let new: Option<String> = conn.get(format!("{key}:new")).await.unwrap();
        assert_eq!(new, None, "{key}:new");
    }
}

/// Three primaries with a replica each: every primary has one replica, a killed primary's
/// replica takes over its slots and has its data, and the killed node comes back as a
/// replica.
#[tokio::test]
async fn a_cluster_with_replicas_fails_over() {
    let mut redis = RedisServer::cluster(3, 1);
    let nodes = redis.nodes();
    assert_eq!(nodes.len(), 6);
    let primaries: Vec<_> = nodes.iter().filter(|n| n.role == Role::Primary).collect();
    assert_eq!(primaries.len(), 3);
    for p in &primaries {
        let replicas = nodes
            .iter()
            .filter(|n| {
                n.role
                    == Role::Replica {
                        primary_id: p.id.clone(),
                    }
            })
            .count();
        assert_eq!(replicas, 1, "{nodes:?}");
    }

    let key = "seckill:{7}:sale";
    let slot = redis.key_slot(key);
    let old = redis.primary_of_slot(slot);
    let old_id = nodes.iter().find(|n| n.port == old).unwrap().id.clone();
    let replica = nodes
        .iter()
        .find(|n| {
            n.role
                == Role::Replica {
                    primary_id: old_id.clone(),
                }
        })
        .unwrap()
        .port;
    let mut conn = redis.connect().await;
    let _: () = conn.set(key, "kept").await.unwrap();
    let acked: i64 = redis
        .query(old, redis::cmd("WAIT").arg(1).arg(5_000))
        .unwrap();
    assert_eq!(acked, 1, "the replica has the write");

    redis.kill(old);
    redis.wait_ok(Duration::from_secs(30));
    assert_eq!(redis.primary_of_slot(slot), replica);
    let mut conn = redis.connect().await;
    let got: String = conn.get(key).await.unwrap();
    assert_eq!(got, "kept");

    redis.revive(old);
    redis.wait_ok(Duration::from_secs(30));
    let back = redis.nodes().into_iter().find(|n| n.port == old).unwrap();
    assert_eq!(
        back.role,
        Role::Replica {
            primary_id: redis
                .nodes()
                .into_iter()
                .find(|n| n.port == replica)
                .unwrap()
                .id
        }
    );
}

/// The dropper loses the reply of the armed command on whichever node it reaches, here a
/// key on every primary in turn; the cluster client sends the command again.
#[tokio::test]
async fn the_reply_dropper_loses_a_reply_on_any_node() {
    let redis = RedisServer::start();
    let keys = keys_on_every_primary(&redis);
    let proxy = ReplyDropper::start(&redis).await;
    let mut cfg = redis.config();
    cfg.url = proxy.url();
    let mut conn = seckill_shared::adapters::redis::RedisConn::connect(&cfg)
        .await
        .unwrap();
    for (i, key) in keys.iter().enumerate() {
        proxy.arm(&[b"INCR", key.as_bytes()]);
        let n: i64 = conn.incr(key, 1).await.unwrap();
        assert_eq!(proxy.dropped(), i + 1, "{key}");
        // Ran twice: the lost reply's command, then the client's retry.
        assert_eq!(n, 2, "{key}");
    }
}
