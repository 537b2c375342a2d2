//! A chat service's incoming webhook on loopback (it stands in for Slack, Mattermost or a Teams
//! Workflows trigger, which cannot be reached from a test): it records every body and its
//! headers, and answers from a script the test sets (to play a channel that throttles with 429
//! and `Retry-After`, or one that hangs).

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// One request it got.
#[derive(Debug, Clone)]
pub struct ChatMessage {
    /// The path after `/chat/` (one receiver serves several endpoints).
    pub channel: String,
    /// The parsed body.
    pub body: serde_json::Value,
    /// The headers.
    pub headers: HeaderMap,
    /// When it arrived (Unix seconds, fractional).
    pub at: f64,
}

/// How it answers.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    /// This status, with this `Retry-After` (seconds).
    Status(u16, Option<u32>),
    /// Never answers (the attempt times out).
    Hang,
}

#[derive(Default)]
struct Inner {
    got: Mutex<Vec<ChatMessage>>,
    /// Answers in turn; the last one repeats.
    script: Mutex<Vec<Answer>>,
}

/// A running chat receiver.
#[derive(Clone)]
pub struct ChatReceiver {
    inner: Arc<Inner>,
    /// Its base URL; an endpoint's URL is `{base}/chat/{channel}`.
    pub base: String,
}

async fn hook(
    State(inner): State<Arc<Inner>>,
    Path(channel): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = {
        let mut s = inner.script.lock().unwrap();
        if s.len() > 1 {
            s.remove(0)
        } else {
            s.first().copied().unwrap_or(Answer::Status(200, None))
        }
    };
    inner.got.lock().unwrap().push(ChatMessage {
        channel,
        body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        headers,
        at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64(),
    });
    match answer {
        Answer::Hang => {
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
            StatusCode::OK.into_response()
        }
        Answer::Status(s, retry) => {
            let mut r = StatusCode::from_u16(s).unwrap().into_response();
            if let Some(after) = retry {
                r.headers_mut()
                    .insert("retry-after", HeaderValue::from(after));
            }
            r
        }
    }
}

impl ChatReceiver {
    /// Starts one answering 200 (Slack's answer) until told otherwise.
    pub async fn start() -> ChatReceiver {
        let inner = Arc::new(Inner::default());
        let app = axum::Router::new()
            .route("/chat/{channel}", axum::routing::post(hook))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        ChatReceiver { inner, base }
    }

    /// The URL of `channel`.
    pub fn url(&self, channel: &str) -> String {
        format!("{}/chat/{channel}", self.base)
    }

    /// Answer these in turn, then the last one again and again.
    pub fn script(&self, answers: Vec<Answer>) {
        *self.inner.script.lock().unwrap() = answers;
    }

    /// Every request so far, of `channel`.
    pub fn got(&self, channel: &str) -> Vec<ChatMessage> {
        (self.inner.got.lock().unwrap().iter())
            .filter(|m| m.channel == channel)
            .cloned()
            .collect()
    }
}
