//! JSON in place of MessagePack while the aggregator cannot read it (schema/WIRE.md,
//! "MessagePack").
//!
//! A 415, or a 400 naming `body`, to a MessagePack body means one of two things: the aggregator
//! reads JSON only (it is older than this exporter), or this one body is damaged (a corrupt spool
//! file). The sender tells them apart by reading the refused body back itself:
//! - a body it can decode goes again at once as JSON, under the same `batch_id`, and so does every
//!   batch after it for [`ShipConfig::msgpack_retry`](super::ShipConfig); then MessagePack is tried
//!   again, since the aggregator may have been upgraded meanwhile;
//! - a body it cannot decode either was at fault, not the aggregator: it is set aside as rejected
//!   and the format stays MessagePack. One bad file no longer turns the node to JSON for good.
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

#[derive(Clone)]
struct State {
    since: Instant,
    /// The spool entry whose refusal started the fallback, and what the aggregator said.
    trigger: (u64, String),
}

/// What to send for a spooled body, given the fallback.
pub(super) enum Body {
    /// Send these bytes.
    Send(Vec<u8>),
    /// The body is MessagePack that does not decode here either: it cannot be sent in any
    /// format. The reason names what failed (and the aggregator's answer, if its refusal started
    /// a fallback that is now undone).
    Damaged(String),
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

    /// Whether bodies go as JSON now. A fallback older than the retry period ends here.
    pub(super) fn sending_json(&self) -> bool {
        let mut state = self.state();
        if state
            .as_ref()
            .is_some_and(|s| s.since.elapsed() >= self.retry)
        {
            *state = None;
            self.gauge.set(0);
            tracing::info!(
                after_s = self.retry.as_secs(),
                "Trying MessagePack bodies again after a fallback to JSON (--msgpack-retry)."
            );
        }
        state.is_some()
    }

    /// The format new batches are sealed in, `configured` unless a fallback is on.
    pub(super) fn format(&self, configured: wire::Format) -> wire::Format {
        if self.sending_json() {
            wire::Format::Json
        } else {
            configured
        }
    }

    /// The aggregator refused spool entry `seq`, a MessagePack body, as unreadable: JSON from now
    /// on, starting with that entry.
    pub(super) fn refused(&self, seq: u64, detail: String) {
        *self.state() = Some(State {
            since: Instant::now(),
            trigger: (seq, detail),
        });
        self.gauge.set(1);
    }

    /// What to send for spool entry `seq`: `body` as it is, or as JSON during a fallback. A
    /// MessagePack body that does not decode is [`Body::Damaged`]; if its refusal started the
    /// fallback, the fallback ends, as the aggregator was not at fault.
    pub(super) fn body(&self, seq: u64, body: Vec<u8>) -> Body {
        if !self.sending_json() || wire::Format::of_body(&body, true) == wire::Format::Json {
            return Body::Send(body);
        }
        // The exporter's own batch, read back: bounds far past any it seals.
        let limits = wire::Limits {
            max_samples: 1 << 32,
            max_series: 1 << 24,
        };
        match wire::Batch::decode_as(&body, true, wire::Format::MessagePack, &limits) {
            Ok(batch) => Body::Send(batch.encode_as(wire::Format::Json)),
            Err(e) => {
                let mut state = self.state();
                let started_it = state.as_ref().filter(|s| s.trigger.0 == seq).cloned();
                let Some(s) = started_it else {
                    return Body::Damaged(format!("the spooled body does not decode: {e}"));
                };
                *state = None;
                self.gauge.set(0);
                tracing::warn!(
                    "The aggregator's refusal was this body's fault, not its format's: back to MessagePack."
                );
                Body::Damaged(format!(
                    "the aggregator refused it ({}) and it does not decode here either: {e}",
                    s.trigger.1
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgpack_body() -> Vec<u8> {
        wire::Batch::from_samples("n1", &[]).encode_as(wire::Format::MessagePack)
    }

    /// A damaged body's refusal undoes the fallback it started; a readable body's refusal keeps
    /// JSON until the retry period is over.
    #[test]
    fn only_a_readable_refused_body_keeps_the_exporter_on_json() {
        let gauge = Gauge::default();
        let f = Fallback::new(Duration::from_secs(3600), gauge.clone());
        assert_eq!(
            f.format(wire::Format::MessagePack),
            wire::Format::MessagePack
        );

        // Entry 7 is damaged: gzip fine, MessagePack truncated.
        let mut damaged = Vec::new();
        {
            use std::io::Write;
            let mut gz = flate2::write::GzEncoder::new(&mut damaged, flate2::Compression::fast());
            gz.write_all(&[0x85, 0xa8]).unwrap();
            gz.finish().unwrap();
        }
        f.refused(7, "HTTP 400: body".into());
        assert_eq!(gauge.get(), 1);
        match f.body(7, damaged) {
            Body::Damaged(why) => assert!(why.contains("HTTP 400: body"), "{why}"),
            Body::Send(_) => panic!("a damaged body was sent"),
        }
        assert_eq!(gauge.get(), 0);
        assert_eq!(
            f.format(wire::Format::MessagePack),
            wire::Format::MessagePack
        );

        // Entry 8 decodes: it goes as JSON, and new batches are sealed as JSON.
        f.refused(8, "HTTP 415".into());
        match f.body(8, msgpack_body()) {
            Body::Send(b) => assert_eq!(wire::Format::of_body(&b, true), wire::Format::Json),
            Body::Damaged(why) => panic!("{why}"),
        }
        assert_eq!(f.format(wire::Format::MessagePack), wire::Format::Json);
        assert_eq!(gauge.get(), 1);
    }

    #[test]
    fn messagepack_is_tried_again_after_the_retry_period() {
        let gauge = Gauge::default();
        let f = Fallback::new(Duration::from_millis(50), gauge.clone());
        f.refused(1, "HTTP 415".into());
        assert!(f.sending_json());
        std::thread::sleep(Duration::from_millis(60));
        assert!(!f.sending_json());
        assert_eq!(gauge.get(), 0);
        let body = msgpack_body();
        match f.body(2, body.clone()) {
            Body::Send(b) => assert_eq!(b, body, "sent as sealed"),
            Body::Damaged(why) => panic!("{why}"),
        }
    }
}
