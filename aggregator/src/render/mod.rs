//! The values the ledger's analytics return, rendered for people: tables ([`views`]) that the pages
//! show and the CSV exports write, and the CSV answer itself. Below both the JSON API and the
//! pages, so neither imports the other to render a value, and a page and its CSV are one
//! rendering apart, never two computations.

pub mod views;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use gpuledger_web::Table;

/// A CSV download.
pub fn csv_response(table: &Table, name: &str) -> Response {
    let file: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut r = table.to_csv().into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8; header=present"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{file}.csv\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    r
}
