//! Who attempts when: the sequence of users of a run, and their tokens.
//!
//! A sale's `attempts` come from `users` distinct users with repeats: every user once,
//! the rest drawn at random, all shuffled with a seed, so every variant of one run sees
//! the same sequence. The admit path uses a fresh user per attempt (stock never runs
//! out, so every attempt is an admission).

use http::HeaderValue;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// The user of each attempt: attempt `i` is made by user `order[i]`.
#[derive(Debug, Clone)]
pub struct Plan {
    order: Vec<u32>,
    users: u32,
}

impl Plan {
    /// `attempts` attempts by exactly `users` distinct users (each at least once when
    /// `attempts >= users`), in a seeded random order.
    pub fn mixed(attempts: u64, users: u32, seed: u64) -> Plan {
        let users = users.max(1);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut order: Vec<u32> = (0..users).take(attempts as usize).collect();
        order.extend((order.len() as u64..attempts).map(|_| rng.random_range(0..users)));
        order.shuffle(&mut rng);
        Plan { order, users }
    }

    /// Attempt `i` is made by user `i`.
    pub fn distinct(attempts: u64) -> Plan {
        let users = attempts as u32;
        Plan {
            order: (0..users).collect(),
            users,
        }
    }

    pub fn attempts(&self) -> u64 {
        self.order.len() as u64
    }

    /// How many distinct users the plan uses (and tokens it needs).
    pub fn users(&self) -> u32 {
        self.users.min(self.order.len() as u32)
    }

    /// The user of attempt `i`.
    pub fn user(&self, i: u64) -> u32 {
        self.order[i as usize]
    }
}

/// The user id of user number `idx`.
pub fn user_name(idx: u32) -> String {
    format!("user-{idx:07}")
}

/// `Authorization` header values of users `0..len`, HS256 tokens signed with the
/// function's dev secret and valid for a day.
#[derive(Debug, Clone)]
pub struct Tokens(Vec<HeaderValue>);

impl Tokens {
    pub fn mint(secret: &[u8], users: u32) -> Tokens {
        let exp = time::OffsetDateTime::now_utc().unix_timestamp() + 86_400;
        Tokens(
            (0..users)
                .map(|i| {
                    let t = seckill_shared::auth::mint_hs256(secret, &user_name(i), None, exp);
                    HeaderValue::try_from(format!("Bearer {t}"))
                        .expect("a minted token is base64url and dots only")
                })
                .collect(),
        )
    }

    /// The header of user `idx`.
    pub fn header(&self, idx: u32) -> &HeaderValue {
        &self.0[idx as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mixed_plan_has_every_user_and_only_them() {
        let p = Plan::mixed(1_000, 200, 7);
        assert_eq!(p.attempts(), 1_000);
        let mut seen: Vec<u32> = (0..1_000).map(|i| p.user(i)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, (0..200).collect::<Vec<_>>());
        let q = Plan::mixed(1_000, 200, 7);
        assert!((0..1_000).all(|i| p.user(i) == q.user(i)), "seeded");
        assert_eq!(Plan::mixed(10, 200, 1).users(), 10);
    }

    #[test]
    fn minted_tokens_carry_the_user_as_sub() {
        let t = Tokens::mint(b"s", 3);
        let h = t.header(2).to_str().unwrap();
        let tok = h.strip_prefix("Bearer ").unwrap();
        let id = seckill_shared::auth::verify_hs256(tok, b"s", 0).unwrap();
        assert_eq!(id.user.as_str(), "user-0000002");
    }
}
