//! Every role's HTTP listener (the aggregator's API, the exporter's `/metrics`, the reclaimer's
//! hook): one accept loop with a header read timeout and a connection bound.
//!
//! Key decision: a connection past the bound is answered `503` and closed the moment it is
//! accepted, instead of being left in the kernel's queue or served. A process out of file
//! descriptors cannot open its ledger, its spool or a socket to a scheduler; a process at its
//! connection bound still can, and frees a place within `header_read_timeout` of any client that
//! holds one without sending a request. The bound is kept below the process's descriptor limit
//! (raised to its hard limit at start), with [`RESERVED_DESCRIPTORS`] left for everything else.
//!
//! The timeout is hyper's: a client must have sent a request's whole head this long after it
//! connected or after its previous answer, or the connection is closed. Bodies have their own
//! limits in each role (the aggregator's `body_read_timeout`, the request timeout).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gpuledger_schema::options::duration;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// Connections served at once when `max_connections` is not given: 1,250 exporters (10,000
/// GPUs at 8 a node) each keep one to the aggregator, with room for pages, scrapes and probes.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// How long a client has to send a request's head when `header_read_timeout` is not given:
/// longer than the exporter's 5 s shipping interval, so its kept-alive connection stays open.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// File descriptors kept for everything but client connections (the ledger and its WAL, the
/// spool, outgoing HTTP, logs).
pub const RESERVED_DESCRIPTORS: usize = 256;

/// What a role's listener allows: flags and keys of the config file's `[http]` table, the same in
/// every role.
#[derive(Debug, Default, Clone, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpOptions {
    /// Connections served at once; one more is answered 503 and closed at once. Kept below the
    /// process's file descriptor limit.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// A client must send a request's head within this long of connecting or of its previous
    /// answer, or its connection is closed.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub header_read_timeout: Option<Duration>,
}

/// A listener's resolved limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    /// Connections served at once.
    pub max_connections: usize,
    /// See [`HttpOptions::header_read_timeout`].
    pub header_read_timeout: Duration,
}

impl Default for Listening {
    fn default() -> Self {
        Listening {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        }
    }
}

/// The defaults of the listener's options, as the help shows them
/// ([`crate::process::with_defaults`]).
pub fn shown_defaults() -> Vec<(&'static str, String)> {
    vec![
        ("max_connections", DEFAULT_MAX_CONNECTIONS.to_string()),
        (
            "header_read_timeout",
            crate::process::shown_duration(DEFAULT_HEADER_READ_TIMEOUT),
        ),
    ]
}

impl HttpOptions {
    /// Checks the options and fills in the defaults; the error names the key.
    pub fn resolve(&self) -> Result<Listening, String> {
        let d = Listening::default();
        let max_connections = self.max_connections.unwrap_or(d.max_connections);
        if max_connections == 0 {
            return Err("max_connections must be at least 1".into());
        }
        let header_read_timeout = self.header_read_timeout.unwrap_or(d.header_read_timeout);
        if header_read_timeout.is_zero() {
            return Err("header_read_timeout must be longer than 0s".into());
        }
        Ok(Listening {
            max_connections,
            header_read_timeout,
        })
    }
}

/// Raises the soft file descriptor limit to the hard one and returns `wanted`, or fewer where the
/// limit leaves less than `wanted` + [`RESERVED_DESCRIPTORS`] (logged: the operator raises
/// `LimitNOFILE` or `ulimit -n`).
pub fn fit_to_descriptors(wanted: usize) -> usize {
    let Some(limit) = raise_descriptor_limit() else {
        return wanted;
    };
    let room = limit.saturating_sub(RESERVED_DESCRIPTORS).max(1);
    if wanted > room {
        tracing::warn!(
            max_connections = wanted,
            open_files_limit = limit,
            serving = room,
            "The open files limit leaves room for fewer connections than max_connections; \
             raise it (LimitNOFILE=, ulimit -n) to serve them all."
        );
        return room;
    }
    wanted
}

/// The soft `RLIMIT_NOFILE` after raising it to the hard limit; `None` where it cannot be read.
fn raise_descriptor_limit() -> Option<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct passed; nothing else is touched.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above; a refusal leaves the limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    Some(usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX))
}

/// What a connection past the bound reads before it is closed: a whole `503` in the one error
/// shape, small enough for any socket's send buffer.
fn busy_answer() -> &'static [u8] {
    static BUSY: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
        let body = serde_json::to_string(&gpuledger_schema::error::ErrorBody::new(
            Some("max_connections"),
            "the server is at its connection limit; retry in a moment",
        ))
        .expect("an error body serialises");
        format!(
            "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    });
    &BUSY
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets the requests in progress
/// finish (each connection is told to close after its current answer) and returns once every
/// connection has ended.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Listening,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let max = fit_to_descriptors(limits.max_connections)
        .min(Semaphore::MAX_PERMITS)
        .min(u32::MAX as usize);
    let places = Arc::new(Semaphore::new(max));
    let (stop_tx, stop_rx) = watch::channel(false);
    let service = hyper_util::service::TowerToHyperService::new(app);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors (EMFILE, ENFILE) or a connection reset before it was
                    // accepted: not the listener's end. Wait a moment rather than spin.
                    tracing::warn!(error = %e, "Cannot accept a connection.");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            // Refused now: the answer fits the socket's send buffer, so it is written without
            // waiting, and the descriptor is closed on drop.
            let _ = stream.try_write(busy_answer());
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection = http.serve_connection(TokioIo::new(stream), service.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _place = place;
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = stop.wait_for(|s| *s) => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every place back: every connection has ended.
    let _ = places.acquire_many(max as u32).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_answer_is_a_whole_http_response() {
        let text = std::str::from_utf8(busy_answer()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, body.len());
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        let error = gpuledger_schema::error::ErrorBody::parse(body.as_bytes()).unwrap();
        assert_eq!(error.error.field.as_deref(), Some("max_connections"));
    }

    #[test]
    fn options_name_what_is_wrong() {
        let zero = HttpOptions {
            max_connections: Some(0),
            ..Default::default()
        };
        assert!(zero.resolve().unwrap_err().contains("max_connections"));
        let instant = HttpOptions {
            header_read_timeout: Some(Duration::ZERO),
            ..Default::default()
        };
        assert!(
            instant
                .resolve()
                .unwrap_err()
                .contains("header_read_timeout")
        );
        assert_eq!(
            HttpOptions::default().resolve().unwrap(),
            Listening::default()
        );
    }

    /// Reads until the server closes the connection (an answer, a reset or nothing); `None` if
    /// it is still open after `wait`.
    async fn closed_within(s: &mut tokio::net::TcpStream, wait: Duration) -> Option<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        match tokio::time::timeout(wait, s.read_to_end(&mut got)).await {
            Ok(_) => Some(got),
            Err(_) => None,
        }
    }

    /// Regression (issue 48, finding 1): connections that never finish their headers were held
    /// for good, until the process ran out of file descriptors. Now one past the bound is
    /// answered 503 at once, the held ones are closed after the header read timeout, and the
    /// listener serves again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unfinished_headers_cannot_hold_the_listener() {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok\n" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let limits = Listening {
            max_connections: 4,
            header_read_timeout: Duration::from_secs(1),
        };
        let server = tokio::spawn(serve(listener, app, limits, async {
            let _ = stopped.await;
        }));
        let mut held = Vec::new();
        for _ in 0..4 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
            held.push(s);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut fifth = tokio::net::TcpStream::connect(addr).await.unwrap();
        let answer = closed_within(&mut fifth, Duration::from_millis(500))
            .await
            .expect("the fifth connection is answered at once");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
        assert!(answer.contains("\"max_connections\""), "{answer}");
        for s in &mut held {
            assert!(
                closed_within(s, Duration::from_secs(3)).await.is_some(),
                "a connection without a whole head is closed after the header read timeout"
            );
        }
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = closed_within(&mut s, Duration::from_secs(2)).await.unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the listener ends once asked to")
            .unwrap()
            .unwrap();
    }
}
