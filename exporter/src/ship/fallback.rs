//! JSON in place of MessagePack while the aggregator cannot read it (schema/WIRE.md,
//! "MessagePack bodies").
//!
//! A 415, or a 400 naming `body`, to a MessagePack body means one of two things: the aggregator
//! reads JSON only (it is older than this exporter), or this one body is damaged (a corrupt spool
//! file). The sender tells them apart by decoding the refused body itself ([`Fallback::refused`])
//! before anything changes:
//! - a body it can decode goes again at once as JSON, under the same `batch_id`, and so does every
//!   batch for [`ShipConfig::msgpack_retry`](super::ShipConfig); then MessagePack is tried again,
//!   since the aggregator may have been upgraded meanwhile. The refused batch itself always goes
//!   as JSON next, however short the period: each batch is sent as MessagePack at most once;
//! - a body it cannot decode either was at fault, not the aggregator: it is set aside as rejected
//!   and the format stays as it was. One bad file no longer turns the node to JSON for good.
//!
//! While JSON is sent for this reason `gpuledger_exporter_wire_json_fallback` reads 1, so a fleet
//! half on JSON is visible without reading logs.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpuledger_schema::wire;
use prometheus_client::metrics::gauge::Gauge;

/// The sender's record of a fallback to JSON, shared with the sealer (which encodes new batches
/// in [`Fallback::format`]).
pub(super) struct Fallback {
    state: Mutex<Option<State>>,
    retry: Duration,
    gauge: Gauge,
}

struct State {
    since: Instant,
    /// The spool entry whose refusal started the fallback: it goes as JSON whatever the time.
    trigger: u64,
}

/// What to send for a spooled body, given the fallback.
pub(super) enum Body {
    /// Send these bytes.
    Send(Vec<u8>),
    /// The body is MessagePack that does not decode here: it cannot be sent in any format.
    Damaged(String),
}

/// What a refusal of a MessagePack body as unreadable turned out to be.
pub(super) enum Refusal {
    /// The body decodes here: the aggregator cannot read MessagePack. JSON from now on.
    FallBack,
    /// The body does not decode here either: it was at fault. Nothing else changes.
    Damaged(String),
}

/// The exporter's own batch, read back: bounds far past any it seals.
fn decode(body: &[u8]) -> Result<wire::Batch, wire::WireError> {
    let limits = wire::Limits {
        max_samples: 1 << 32,
        max_series: 1 << 24,
    };
    wire::Batch::decode_as(body, true, wire::Format::MessagePack, &limits)
}

impl Fallback {
    /// No fallback yet; one lasts `retry` before MessagePack is tried again.
    pub(super) fn new(retry: Duration, gauge: Gauge) -> Self {
        gauge.set(0);
        Fallback {
            state: Mutex::new(None),
            retry,
            gauge,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Option<State>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether spool entry `seq` goes as JSON (`None`: a new batch being sealed). A fallback
    /// older than the retry period ends here, except for the entry that started it.
    fn json_for(&self, seq: Option<u64>) -> bool {
        let mut state = self.state();
        let Some(s) = state.as_ref() else {
            return false;
        };
        if seq == Some(s.trigger) || s.since.elapsed() < self.retry {
            return true;
        }
        *state = None;
        self.gauge.set(0);
        tracing::info!(
            after_s = self.retry.as_secs(),
            "Trying MessagePack bodies again after a fallback to JSON (--msgpack-retry)."
        );
        false
    }

    /// The format new batches are sealed in, `configured` unless a fallback is on.
    pub(super) fn format(&self, configured: wire::Format) -> wire::Format {
        if self.json_for(None) {
            wire::Format::Json
        } else {
            configured
        }
    }

    /// The aggregator refused spool entry `seq`, the MessagePack `body`, as unreadable: a
    /// fallback to JSON, starting with that entry, if the body decodes here.
    pub(super) fn refused(&self, seq: u64, body: &[u8]) -> Refusal {
        if let Err(e) = decode(body) {
            return Refusal::Damaged(format!("it does not decode here either: {e}"));
        }
        *self.state() = Some(State {
            since: Instant::now(),
            trigger: seq,
        });
        self.gauge.set(1);
        Refusal::FallBack
    }

    /// What to send for spool entry `seq`: `body` as it is, or as JSON during a fallback. A
    /// MessagePack body that does not decode then is [`Body::Damaged`].
    pub(super) fn body(&self, seq: u64, body: Vec<u8>) -> Body {
        if !self.json_for(Some(seq)) || wire::Format::of_body(&body, true) == wire::Format::Json {
            return Body::Send(body);
        }
        match decode(&body) {
            Ok(batch) => Body::Send(batch.encode_as(wire::Format::Json)),
            Err(e) => Body::Damaged(format!("the spooled body does not decode: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgpack_body() -> Vec<u8> {
        wire::Batch::from_samples("n1", &[]).encode_as(wire::Format::MessagePack)
    }

    /// gzip intact, MessagePack cut short.
    fn damaged_body() -> Vec<u8> {
        use std::io::Write;
        let mut out = Vec::new();
        let mut gz = flate2::write::GzEncoder::new(&mut out, flate2::Compression::fast());
        gz.write_all(&[0x85, 0xa8]).unwrap();
        gz.finish().unwrap();
        out
    }

    /// A damaged body's refusal changes nothing; a readable body's refusal turns to JSON, that
    /// body first.
    #[test]
    fn only_a_readable_refused_body_turns_the_exporter_to_json() {
        let gauge = Gauge::default();
        let f = Fallback::new(Duration::from_secs(3600), gauge.clone());
        assert_eq!(
            f.format(wire::Format::MessagePack),
            wire::Format::MessagePack
        );

        assert!(matches!(f.refused(7, &damaged_body()), Refusal::Damaged(_)));
        assert_eq!(gauge.get(), 0);
        assert_eq!(
            f.format(wire::Format::MessagePack),
            wire::Format::MessagePack
        );

        let body = msgpack_body();
        assert!(matches!(f.refused(8, &body), Refusal::FallBack));
        assert_eq!(gauge.get(), 1);
        match f.body(8, body) {
            Body::Send(b) => assert_eq!(wire::Format::of_body(&b, true), wire::Format::Json),
            Body::Damaged(why) => panic!("{why}"),
        }
        assert_eq!(f.format(wire::Format::MessagePack), wire::Format::Json);
        // A damaged body met during a fallback cannot be sent at all.
        assert!(matches!(f.body(9, damaged_body()), Body::Damaged(_)));
    }

    /// After the period MessagePack is tried again; the batch that started the fallback still
    /// goes as JSON, even with no period at all, so no batch is refused as MessagePack twice.
    #[test]
    fn messagepack_is_tried_again_after_the_retry_period_but_never_twice_for_one_batch() {
        let gauge = Gauge::default();
        let f = Fallback::new(Duration::ZERO, gauge.clone());
        let body = msgpack_body();
        assert!(matches!(f.refused(1, &body), Refusal::FallBack));
        match f.body(1, body.clone()) {
            Body::Send(b) => assert_eq!(wire::Format::of_body(&b, true), wire::Format::Json),
            Body::Damaged(why) => panic!("{why}"),
        }
        match f.body(2, body.clone()) {
            Body::Send(b) => assert_eq!(b, body, "sent as sealed"),
            Body::Damaged(why) => panic!("{why}"),
        }
        assert_eq!(gauge.get(), 0);
        assert_eq!(
            f.format(wire::Format::MessagePack),
            wire::Format::MessagePack
        );
    }
}
