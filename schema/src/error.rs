//! The one JSON shape of every error a gpuledger service answers (the aggregator's API and
//! pages, the exporter, the reclaimer):
//! `{"error": {"field": "series[2].sm_active[7]", "message": "1.5 is outside 0–1"}}`.
//! `field` names the request field at fault (a JSON path, a header or a query parameter) and is
//! null when no single field is. Declared once here so that every server writes it and every
//! client reads it the same way.

use serde::{Deserialize, Serialize};

/// An error answer's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// The request field at fault, if one is.
    pub field: Option<String>,
    /// What is wrong, as a sentence.
    pub message: String,
}

impl ErrorBody {
    /// An error naming `field` (or none).
    pub fn new(field: Option<&str>, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                field: field.map(str::to_owned),
                message: message.into(),
            },
        }
    }

    /// Reads an error answer; `None` when `body` is not one.
    pub fn parse(body: &[u8]) -> Option<ErrorBody> {
        serde_json::from_slice(body).ok()
    }
}
