//! Who may start an ingest request now: bounded, fair slots.
//!
//! Key decision: a slot is taken after the token is checked and before the body is read, and the
//! body then has a deadline, so a client that trickles its body holds one slot for at most
//! `body_read_timeout`. No token may hold more than `ingest_slots_per_token` slots (429 with
//! Retry-After past it), so one token (a leaked one, or a stuck client) cannot take every slot;
//! a request that finds every slot taken waits `ingest_slot_wait`, then gets 503 with
//! Retry-After. Exporters retry both (`schema/WIRE.md`). Decoding, the CPU- and memory-heavy
//! part, has its own smaller set of slots.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::TokenId;
use crate::config::Limits;
use crate::error::ApiError;

/// The ingest slots and decode slots of one service.
pub struct Admission {
    slots: Arc<Semaphore>,
    held: Arc<Mutex<HashMap<TokenId, usize>>>,
    per_token: usize,
    wait: std::time::Duration,
    decode: Arc<Semaphore>,
}

/// One admitted ingest request; its slot and its token's share are given back when this is
/// dropped.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    _share: Share,
}

/// One of a token's shares, counted while held.
struct Share {
    token: TokenId,
    held: Arc<Mutex<HashMap<TokenId, usize>>>,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.held.lock().expect("admission lock");
        if let Some(n) = held.get_mut(&self.token) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.token);
            }
        }
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// This token holds its share of the slots (429).
    TokenBusy,
    /// Every slot stayed taken for the whole wait (503).
    Full,
}

impl Refused {
    /// The answer, with Retry-After.
    pub fn into_error(self, per_token: usize) -> ApiError {
        match self {
            Refused::TokenBusy => ApiError::too_many_requests(
                format!(
                    "this token already has {per_token} ingest requests in flight; retry when one has finished"
                ),
                1,
            ),
            Refused::Full => ApiError::unavailable("every ingest slot is taken; retry shortly", 1),
        }
    }
}

impl Admission {
    /// Slots as `limits` sets them.
    pub fn new(limits: &Limits) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(limits.ingest_slots.max(1))),
            held: Arc::default(),
            per_token: limits.ingest_slots_per_token.max(1),
            wait: limits.ingest_slot_wait,
            decode: Arc::new(Semaphore::new(limits.decode_slots.max(1))),
        }
    }

    /// The most slots one token may hold.
    pub fn per_token(&self) -> usize {
        self.per_token
    }

    /// Admits a request of `token`: its share first (no wait), then a free slot (waits up to the
    /// configured time). A refused request gives its share back.
    pub async fn enter(&self, token: TokenId) -> Result<Slot, Refused> {
        let share = {
            let mut held = self.held.lock().expect("admission lock");
            let n = held.entry(token).or_insert(0);
            if *n >= self.per_token {
                return Err(Refused::TokenBusy);
            }
            *n += 1;
            Share {
                token,
                held: self.held.clone(),
            }
        };
        match tokio::time::timeout(self.wait, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Slot {
                _permit: permit,
                _share: share,
            }),
            _ => Err(Refused::Full),
        }
    }

    /// Waits for a decode slot; hold it while inflating and parsing.
    pub async fn decode_slot(&self) -> OwnedSemaphorePermit {
        self.decode
            .clone()
            .acquire_owned()
            .await
            .expect("the decode semaphore is never closed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn admission(slots: usize, per_token: usize) -> Admission {
        Admission::new(&Limits {
            ingest_slots: slots,
            ingest_slots_per_token: per_token,
            ingest_slot_wait: Duration::from_millis(50),
            ..Limits::default()
        })
    }

    /// Regression: 64 slow uploads from one token held every slot, and the fleet's batches waited
    /// a minute. One token now gets at most its share; other tokens still get in.
    #[tokio::test]
    async fn one_token_cannot_take_every_slot() {
        let a = admission(4, 2);
        let (x, y) = (TokenId(0), TokenId(1));
        let x1 = a.enter(x).await.unwrap();
        let _x2 = a.enter(x).await.unwrap();
        assert_eq!(a.enter(x).await.err(), Some(Refused::TokenBusy));
        let _y1 = a.enter(y).await.unwrap();
        let _y2 = a.enter(y).await.unwrap();
        // Every slot taken: a third token waits, then is refused; a freed slot lets it in.
        assert_eq!(a.enter(TokenId(2)).await.err(), Some(Refused::Full));
        drop(x1);
        let _z = a.enter(TokenId(2)).await.unwrap();
        assert!(
            a.enter(x).await.is_err(),
            "x's share is free but no slot is"
        );
        assert_eq!(
            a.held.lock().unwrap()[&x],
            1,
            "a refused request gives its share back"
        );
    }
}
