//! How many invocations of the function the gateway has in flight at once, and what
//! becomes of the rest.
//!
//! `cargo lambda watch` (1.9.2) queues invocations per function in a channel of 100, and
//! its `RequestCache::upsert` awaits room in that channel while holding the cache's write
//! lock; the function's `/next` request needs the read lock of the same cache to take an
//! invocation out. Once 100 invocations wait, the 101st holds the write lock waiting for
//! room that only `/next` can make, and `/next` waits for the lock: the watch never
//! answers again (docs/local-stack.md, "Past 100 requests in flight"). The gateway
//! therefore never has more than [`InFlight::new`]'s limit of invocations at the watch
//! (well below 100); the others wait here, in arrival order, for a place.
//!
//! In AWS a burst beyond the function's instances does not wait: Lambda starts more
//! instances (up to the account's or the function's concurrency, beyond which the
//! invocation is throttled). Locally there is one instance, so a request that found every
//! place taken waits for one, and only a request that could not start within the
//! integration timeout is answered as API Gateway answers a function that took too long
//! (`503 Service Unavailable`). A burst is slower here, never wedged, and every request
//! gets an answer.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The invocations in flight at the function, bounded.
#[derive(Debug, Clone)]
pub struct InFlight {
    places: Arc<Semaphore>,
    limit: usize,
}

/// A place taken: the invocation holds it until it is answered (dropped).
#[derive(Debug)]
pub struct Place(#[allow(dead_code)] OwnedSemaphorePermit);

impl InFlight {
    /// At most `limit` invocations at once (at least 1).
    pub fn new(limit: usize) -> InFlight {
        let limit = limit.max(1);
        InFlight {
            places: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// The bound.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Invocations in flight now.
    pub fn taken(&self) -> usize {
        self.limit - self.places.available_permits()
    }

    /// Waits for a place until `deadline` (tokio's semaphore is fair: first come, first
    /// served); `None` when none came free in time.
    pub async fn enter(&self, deadline: Instant) -> Option<Place> {
        let wait = self.places.clone().acquire_owned();
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(permit)) => Some(Place(permit)),
            // The semaphore is never closed; a timeout is the only other way out.
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_places_are_bounded_and_given_in_arrival_order() {
        let inflight = InFlight::new(2);
        let far = Instant::now() + Duration::from_secs(30);
        let a = inflight.enter(far).await.expect("a place");
        let _b = inflight.enter(far).await.expect("a place");
        assert_eq!(inflight.taken(), 2);
        // The third waits; the fourth behind it.
        let third = tokio::spawn({
            let i = inflight.clone();
            async move { i.enter(far).await }
        });
        tokio::task::yield_now().await;
        let fourth = tokio::spawn({
            let i = inflight.clone();
            async move {
                i.enter(Instant::now() + Duration::from_millis(200))
                    .await
                    .is_some()
            }
        });
        tokio::task::yield_now().await;
        drop(a);
        let third = third.await.unwrap();
        assert!(third.is_some(), "the first waiter gets the freed place");
        assert!(
            !fourth.await.unwrap(),
            "nothing freed within its deadline: no place"
        );
    }

    #[test]
    fn the_limit_is_at_least_one() {
        assert_eq!(InFlight::new(0).limit(), 1);
    }
}
