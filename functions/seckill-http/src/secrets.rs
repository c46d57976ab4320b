//! Signing secrets an instance holds: the payment webhook's and the waiting rooms'
//! entry tokens'. Where the function finds each ([`SecretSource`], part of the
//! [`Config`](crate::config::Config)) and how an instance holds them between reads
//! ([`HeldSecrets`]): a rotation (`new,old`) reaches every instance within
//! [`SECRET_REFRESH`], and an outage of Secrets Manager leaves the held secrets in use.

use std::time::Duration;

use std::time::Instant;

use seckill_shared::webhook::Secrets;
use tokio::sync::Mutex;

use crate::error::ApiError;

/// Where the function finds a set of signing secrets (`seckill_shared`'s one reader):
/// a Secrets Manager secret is read at first use and again every [`SECRET_REFRESH`].
pub use seckill_shared::adapters::secrets::SecretSource;

/// How long an instance keeps the secrets it read before reading them again.
pub const SECRET_REFRESH: Duration = Duration::from_secs(300);

/// After a read that failed, how long until the next one: meanwhile the secrets held
/// before serve on (stale), or, with none held yet, what needs them answers 503 at once
/// instead of every request trying Secrets Manager again (each try can take its whole
/// five-second timeout).
pub const SECRET_RETRY: Duration = Duration::from_secs(10);

/// One set of secrets as an instance holds them.
///
/// An outage of Secrets Manager must not become one of the function: a read that fails
/// keeps the secrets held (a rotation is `new,old`, so the old ones still verify what
/// the provider signs until the next successful read), one request at a time reads
/// while the others go on with what is held, and failures are retried after
/// [`SECRET_RETRY`], not on every request.
pub struct HeldSecrets {
    source: SecretSource,
    /// What they are and the variable that names them, for errors and logs.
    what: &'static str,
    held: std::sync::Mutex<Held>,
    /// Taken by the one request that reads from the source.
    reading: Mutex<()>,
}

#[derive(Default)]
struct Held {
    secrets: Option<Secrets>,
    /// When to read again; `None`: at the next request.
    next_read: Option<Instant>,
    /// Why the last read failed (none held: the 503's detail until the next try).
    failure: Option<String>,
}

impl HeldSecrets {
    /// `what` names them in errors, e.g. "payment webhook secret
    /// (PAYMENT_WEBHOOK_SECRET_ARN)".
    pub fn new(source: SecretSource, what: &'static str) -> HeldSecrets {
        HeldSecrets {
            source,
            what,
            held: std::sync::Mutex::new(Held::default()),
            reading: Mutex::new(()),
        }
    }

    /// The secrets to sign or check with, read from their source if need be.
    pub(crate) async fn get(&self) -> Result<Secrets, ApiError> {
        let (arn, endpoint) = match &self.source {
            SecretSource::Inline(s) => return Ok(s.clone()),
            SecretSource::Missing => {
                return Err(self.unavailable(format!("no {} configured", self.what)));
            }
            SecretSource::SecretsManager { arn, endpoint } => (arn, endpoint.as_deref()),
        };
        self.held_or_read(Instant::now(), || async move {
            let text = seckill_shared::adapters::secrets::secret_string(arn, endpoint)
                .await
                .map_err(|e| e.to_string())?;
            Secrets::parse(&text).map_err(|e| format!("the {} {arn}: {e}", self.what))
        })
        .await
    }

    /// What is held while it is current at `now` (or, none held, the last failure while
    /// its retry waits); otherwise one read through `read`, which concurrent requests
    /// do not repeat: they take what is held meanwhile, or, with nothing held, wait for
    /// that read's outcome. (`now` is the caller's, so that tests set the clock.)
    async fn held_or_read<F, Fut>(&self, now: Instant, read: F) -> Result<Secrets, ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Secrets, String>>,
    {
        if let Some(answer) = self.current(now) {
            return answer;
        }
        let _reading = match self.reading.try_lock() {
            Ok(guard) => guard,
            Err(_) => {
                if let Some(secrets) = self.state().secrets.clone() {
                    return Ok(secrets);
                }
                let _after = self.reading.lock().await;
                return self.current(now).unwrap_or_else(|| {
                    Err(self.unavailable(format!("the {} could not be read", self.what)))
                });
            }
        };
        // Another request may have read while this one waited for the lock's turn.
        if let Some(answer) = self.current(now) {
            return answer;
        }
        let outcome = read().await;
        let mut held = self.state();
        match outcome {
            Ok(secrets) => {
                held.secrets = Some(secrets.clone());
                held.next_read = Some(now + SECRET_REFRESH);
                held.failure = None;
                Ok(secrets)
            }
            Err(why) => {
                held.next_read = Some(now + SECRET_RETRY);
                match held.secrets.clone() {
                    Some(secrets) => {
                        tracing::warn!(
                            what = self.what,
                            error = why,
                            "could not read the secrets again: the held ones serve on"
                        );
                        Ok(secrets)
                    }
                    None => {
                        held.failure = Some(why.clone());
                        Err(self.unavailable(why))
                    }
                }
            }
        }
    }

    /// The answer without a read at `now`, if none is due.
    fn current(&self, now: Instant) -> Option<Result<Secrets, ApiError>> {
        let held = self.state();
        if held.next_read.is_none_or(|at| now >= at) {
            return None;
        }
        Some(match (&held.secrets, &held.failure) {
            (Some(secrets), _) => Ok(secrets.clone()),
            (None, failure) => Err(self.unavailable(
                failure
                    .clone()
                    .unwrap_or_else(|| format!("the {} could not be read", self.what)),
            )),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Held> {
        // A poisoned lock still holds consistent fields: each update is whole.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn unavailable(&self, detail: String) -> ApiError {
        ApiError::unavailable("secrets", detail)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn held() -> HeldSecrets {
        HeldSecrets::new(SecretSource::Missing, "test secret")
    }

    fn secrets(text: &str) -> Secrets {
        Secrets::parse(text).unwrap()
    }

    /// A source that answers `answers` in turn (then fails), counting its reads.
    fn source(
        reads: &Arc<AtomicUsize>,
        answers: &'static [Result<&'static str, &'static str>],
    ) -> impl FnOnce() -> std::future::Ready<Result<Secrets, String>> {
        let reads = reads.clone();
        move || {
            let n = reads.fetch_add(1, Ordering::SeqCst);
            std::future::ready(match answers.get(n) {
                Some(Ok(text)) => Ok(secrets(text)),
                Some(Err(why)) => Err(why.to_string()),
                None => Err("no more answers".to_string()),
            })
        }
    }

    const FIRST: &str = "whsec_first_0123456789";
    const SECOND: &str = "whsec_second_0123456789";

    #[tokio::test]
    async fn secrets_read_once_serve_until_the_refresh_and_on_through_a_failed_read() {
        let h = held();
        let reads = Arc::new(AtomicUsize::new(0));
        const ANSWERS: &[Result<&str, &str>] = &[Ok(FIRST), Err("down"), Ok(SECOND)];
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let get = |t: Instant| h.held_or_read(t, source(&reads, ANSWERS));
        let refresh = SECRET_REFRESH.as_secs();
        let retry = SECRET_RETRY.as_secs();
        assert_eq!(get(at(0)).await.unwrap(), secrets(FIRST));
        assert_eq!(get(at(refresh - 1)).await.unwrap(), secrets(FIRST));
        assert_eq!(reads.load(Ordering::SeqCst), 1, "held: no read");
        // Due: the read fails, the held secrets serve on, and nothing is read again
        // before the retry.
        assert_eq!(get(at(refresh)).await.unwrap(), secrets(FIRST));
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        assert_eq!(get(at(refresh + retry - 1)).await.unwrap(), secrets(FIRST));
        assert_eq!(reads.load(Ordering::SeqCst), 2, "within the retry: no read");
        assert_eq!(
            get(at(refresh + retry)).await.unwrap(),
            secrets(SECOND),
            "the rotation is picked up once the source answers"
        );
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn with_none_held_a_failed_read_answers_unavailable_until_its_retry() {
        let h = held();
        let reads = Arc::new(AtomicUsize::new(0));
        const ANSWERS: &[Result<&str, &str>] = &[Err("down"), Ok(FIRST)];
        let t0 = Instant::now();
        for s in 0..5 {
            let t = t0 + Duration::from_secs(s);
            let err = h
                .held_or_read(t, source(&reads, ANSWERS))
                .await
                .unwrap_err();
            assert!(matches!(err, ApiError::Unavailable(_)), "{err:?}");
        }
        assert_eq!(
            reads.load(Ordering::SeqCst),
            1,
            "one read for five requests"
        );
        let res = h.held_or_read(t0 + SECRET_RETRY, source(&reads, ANSWERS));
        assert_eq!(res.await.unwrap(), secrets(FIRST));
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    /// A slow read (Secrets Manager timing out) holds up no request that can go on with
    /// the secrets held; with none held, the others wait for that one read, not a read
    /// each.
    #[tokio::test]
    async fn while_one_request_reads_slowly_the_others_do_not_wait_or_read() {
        let h = Arc::new(held());
        let reads = Arc::new(AtomicUsize::new(0));
        const ANSWERS: &[Result<&str, &str>] = &[Ok(FIRST)];
        let t0 = Instant::now();
        h.held_or_read(t0, source(&reads, ANSWERS)).await.unwrap();
        let due = t0 + SECRET_REFRESH;
        // The read due now hangs until `finish` says.
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let slow = {
            let (h, reads) = (h.clone(), reads.clone());
            tokio::spawn(async move {
                h.held_or_read(due, || async move {
                    reads.fetch_add(1, Ordering::SeqCst);
                    let _ = finished.await;
                    Err::<Secrets, String>("timed out".into())
                })
                .await
            })
        };
        while reads.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        // The slow read is under way: another request is served what is held, at once
        // (waiting for the read would wait for ever: it ends only when told below).
        let served = tokio::time::timeout(
            Duration::from_secs(5),
            h.held_or_read(due, source(&reads, ANSWERS)),
        )
        .await
        .expect("served without waiting for the read");
        assert_eq!(served.unwrap(), secrets(FIRST));
        finish.send(()).unwrap();
        assert_eq!(slow.await.unwrap().unwrap(), secrets(FIRST));
        assert_eq!(
            reads.load(Ordering::SeqCst),
            2,
            "one read for the two requests"
        );

        // Nothing held: the second request waits for the first one's read.
        let cold = Arc::new(held());
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let started = Arc::new(AtomicUsize::new(0));
        let first = {
            let (cold, started) = (cold.clone(), started.clone());
            tokio::spawn(async move {
                cold.held_or_read(t0, || async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    let _ = finished.await;
                    Ok(secrets(FIRST))
                })
                .await
            })
        };
        while started.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        let second = {
            let cold = cold.clone();
            tokio::spawn(async move {
                cold.held_or_read(t0, || async { panic!("a second read") })
                    .await
            })
        };
        tokio::task::yield_now().await;
        finish.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), secrets(FIRST));
        assert_eq!(second.await.unwrap().unwrap(), secrets(FIRST));
    }
}
