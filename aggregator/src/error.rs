//! The one error type of the HTTP API, answered in the one JSON shape of
//! [`gpuledger_schema::error`]:
//! `{"error": {"field": "series[2].sm_active[7]", "message": "1.5 is outside 0–1"}}`
//! (`field` is null when no single field is at fault). Internal errors are logged here, once.

use std::borrow::Cow;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use gpuledger_schema::error::ErrorBody;

/// An HTTP error answer.
#[derive(Debug)]
pub struct ApiError {
    /// The status.
    pub status: StatusCode,
    /// The request field at fault (a JSON path, a header or a query parameter).
    pub field: Option<Cow<'static, str>>,
    /// What is wrong, as a sentence.
    pub message: String,
    /// Seconds after which a retry may succeed (429/503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, field: Option<Cow<'static, str>>, message: String) -> ApiError {
        ApiError {
            status,
            field,
            message,
            retry_after: None,
        }
    }

    /// Any status with a message and no field (the answers of layers and fallbacks).
    pub fn status(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError::new(status, None, message.into())
    }

    /// 400 naming the field.
    pub fn bad_request(field: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, Some(field.into()), message.into())
    }

    /// 401: no or unknown token.
    pub fn unauthorized(message: &str) -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            Some("authorization".into()),
            message.into(),
        )
    }

    /// 403: a valid token used for something it does not cover.
    pub fn forbidden(field: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, Some(field.into()), message.into())
    }

    /// 413: the body is over a limit.
    pub fn too_large(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            Some("body".into()),
            message.into(),
        )
    }

    /// 415: the body's `Content-Type` is not one the endpoint reads; the field is the header.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Some("content-type".into()),
            message.into(),
        )
    }

    /// 408: the request (its body) did not arrive in time; a retry will do.
    pub fn timeout(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            Some("body".into()),
            message.into(),
        )
    }

    /// 422: a valid batch the ledger will not take (a limit of the store); not retried.
    pub fn unprocessable(field: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            Some(field.into()),
            message.into(),
        )
    }

    /// 429 with Retry-After: this caller has too much in flight.
    pub fn too_many_requests(message: impl Into<String>, retry_after: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, None, message.into())
        }
    }

    /// 503 with Retry-After: the service cannot take this now; a retry will do.
    pub fn unavailable(message: impl Into<String>, retry_after: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, None, message.into())
        }
    }

    /// 500: our fault; logged once, here.
    pub fn internal(error: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %error, "A request failed inside the aggregator.");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            "internal error; see the aggregator's log".into(),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(ErrorBody::new(self.field.as_deref(), self.message));
        let mut response = (self.status, body).into_response();
        let headers = response.headers_mut();
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"gpuledger\""),
            );
        }
        response
    }
}

/// `axum::Form`, whose rejections (415 wrong content type, 413 over the body limit, 422 a
/// missing or malformed field) answer in the one JSON error shape, field `body`, instead of
/// axum's plain text.
pub struct Form<T>(pub T);

impl<T, S> axum::extract::FromRequest<S> for Form<T>
where
    axum::Form<T>:
        axum::extract::FromRequest<S, Rejection = axum::extract::rejection::FormRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        match axum::Form::<T>::from_request(req, state).await {
            Ok(axum::Form(v)) => Ok(Form(v)),
            Err(r) => Err(ApiError::new(
                r.status(),
                Some("body".into()),
                r.body_text(),
            )),
        }
    }
}

/// A JSON request body as `T`; a 400 naming the field (its path in the body) otherwise.
pub fn json_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        ApiError::bad_request(
            if path == "." { "body".to_owned() } else { path },
            e.into_inner().to_string(),
        )
    })
}
