//! A fake aggregator: stands in for `gpuledger aggregator` in tests of the exporter's shipping
//! contract (schema/WIRE.md). It authenticates, decodes with the real schema code, records every
//! delivery (duplicates included, flagged by batch id) and can be told to fail.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use gpuledger_schema::Sample;
use gpuledger_schema::wire::{Batch, Format, Limits};
use uuid::Uuid;

/// How the fake answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Store and acknowledge.
    Accept,
    /// 503 with Retry-After: 1, store nothing.
    Unavailable,
    /// Store, then answer 503 as if the acknowledgement was lost: the exporter must re-send the
    /// same batch id.
    AckLost,
    /// 408, store nothing: the aggregator gave up waiting for a body on a slow link.
    Timeout,
    /// An aggregator older than MessagePack bodies: it reads every body as JSON, so a MessagePack
    /// one is a 400 naming the body.
    JsonOnly,
    /// Reads JSON bodies only and answers a MessagePack `Content-Type` 415 before reading the
    /// body, as a receiver (or a proxy in front of one) that refuses the media type does.
    JsonOnly415,
}

/// One POST that carried a valid batch.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub batch_id: Uuid,
    pub node: String,
    pub samples: Vec<Sample>,
    /// The batch id had been stored before.
    pub duplicate: bool,
    /// The body's encoding, from its `Content-Type`.
    pub format: Format,
}

#[derive(Default)]
struct Inner {
    mode: Option<Mode>,
    deliveries: Vec<Delivery>,
    stored_ids: HashSet<Uuid>,
    refused: u32,
    /// `JsonOnly`, `JsonOnly415`: the ids of the MessagePack batches it refused.
    refused_msgpack: Vec<Uuid>,
}

#[derive(Clone)]
struct Shared {
    token: String,
    inner: Arc<Mutex<Inner>>,
}

/// The fake, listening on a fixed loopback port until stopped; restartable on the same port with
/// its records intact.
pub struct FakeAggregator {
    pub port: u16,
    shared: Shared,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

async fn ingest(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, String) {
    let mut out = HeaderMap::new();
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if auth != format!("Bearer {}", s.token) {
        return (
            StatusCode::UNAUTHORIZED,
            out,
            r#"{"error":{"field":"authorization","message":"bad token"}}"#.into(),
        );
    }
    let gzip = headers.get("content-encoding").is_some_and(|v| v == "gzip");
    let Some(format) =
        Format::of_content_type(headers.get("content-type").and_then(|v| v.to_str().ok()))
    else {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            out,
            r#"{"error":{"field":"content-type","message":"not a batch's"}}"#.into(),
        );
    };
    let mode = s.inner.lock().unwrap().mode;
    let json_only = matches!(mode, Some(Mode::JsonOnly | Mode::JsonOnly415));
    if json_only && format == Format::MessagePack {
        // The fake still reads the body it refuses, so a test can tell which batch was refused.
        if let Ok(b) = Batch::decode_as(&body, gzip, format, &Limits::default()) {
            s.inner.lock().unwrap().refused_msgpack.push(b.batch_id);
        }
        if mode == Some(Mode::JsonOnly415) {
            return (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                out,
                r#"{"error":{"field":"content-type","message":"not JSON"}}"#.into(),
            );
        }
    }
    let read_as = if json_only { Format::Json } else { format };
    let batch = match Batch::decode_as(&body, gzip, read_as, &Limits::default()) {
        Ok(b) => b,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                out,
                format!(r#"{{"error":{{"field":"{}","message":"{e}"}}}}"#, e.field()),
            );
        }
    };
    let mut inner = s.inner.lock().unwrap();
    let mode = inner.mode.unwrap_or(Mode::Accept);
    if mode == Mode::Timeout {
        inner.refused += 1;
        return (StatusCode::REQUEST_TIMEOUT, out, "{}".into());
    }
    if mode == Mode::Unavailable {
        inner.refused += 1;
        out.insert("retry-after", "1".parse().unwrap());
        return (StatusCode::SERVICE_UNAVAILABLE, out, "{}".into());
    }
    let duplicate = !inner.stored_ids.insert(batch.batch_id);
    inner.deliveries.push(Delivery {
        batch_id: batch.batch_id,
        node: batch.node.clone(),
        samples: batch.samples().collect(),
        duplicate,
        format,
    });
    if mode == Mode::AckLost {
        out.insert("retry-after", "1".parse().unwrap());
        return (StatusCode::SERVICE_UNAVAILABLE, out, "{}".into());
    }
    (
        StatusCode::OK,
        out,
        // The counts `gpuledger import --aggregator` reads, as the aggregator's answer has them.
        {
            let n = batch.sample_count();
            let stored = if duplicate { 0 } else { n };
            format!(
                r#"{{"accepted":{n},"duplicate":{duplicate},"samples":{n},"stored":{stored},"duplicate_samples":{}}}"#,
                n - stored
            )
        },
    )
}

impl FakeAggregator {
    /// Starts on `port` (0 for any), requiring `token`.
    pub async fn start(port: u16, token: &str) -> FakeAggregator {
        let shared = Shared {
            token: token.into(),
            inner: Arc::default(),
        };
        let mut fake = FakeAggregator {
            port,
            shared,
            stop: None,
            task: None,
        };
        fake.listen().await;
        fake
    }

    async fn listen(&mut self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .unwrap();
        self.port = listener.local_addr().unwrap().port();
        let app = Router::new()
            .route("/api/v1/ingest", post(ingest))
            .with_state(self.shared.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        self.stop = Some(tx);
        self.task = Some(tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        }));
    }

    /// The base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops listening (connections are refused until [`FakeAggregator::restart`]).
    pub async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    /// Listens again on the same port.
    pub async fn restart(&mut self) {
        self.listen().await;
    }

    /// Sets how it answers.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.inner.lock().unwrap().mode = Some(mode);
    }

    /// Every delivery so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared.inner.lock().unwrap().deliveries.clone()
    }

    /// `JsonOnly`, `JsonOnly415`: the ids of the MessagePack batches it refused, in order.
    pub fn refused_msgpack(&self) -> Vec<Uuid> {
        self.shared.inner.lock().unwrap().refused_msgpack.clone()
    }

    /// Requests refused (503 or 408) without storing.
    pub fn refused(&self) -> u32 {
        self.shared.inner.lock().unwrap().refused
    }
}
