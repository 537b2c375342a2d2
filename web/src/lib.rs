//! The finance showback pages of gpuledger: askama templates, the view types they render, and
//! the SVG charts drawn on the server. The aggregator's router serves them; it turns each typed
//! analytics value into these views (`gpuledger_aggregator::ui`).
//!
//! Key decision: one value, three renderings. A page is a list of [`Section`]s, each a
//! [`Table`] with an optional [`Chart`] drawn from the same rows; the CSV export of a table is
//! [`Table::to_csv`] of that same `Table`, and the JSON API serialises the analytics value the
//! table was made from. So a page, its CSV and the API cannot disagree. Every cell keeps its
//! exact value (`data-value`, and the CSV) beside the figure shown.
//!
//! Templates escape every value (askama's HTML escaping, never `|safe` on data); pages need no
//! JavaScript and carry a print stylesheet for A4.

#![warn(missing_docs)]

pub mod chart;
pub mod pages;
pub mod table;

pub use chart::{Chart, Series};
pub use pages::{
    FilterField, FilterForm, GpuLayout, Keep, KeepButton, KeepRefused, Kpi, MoreLink, Nav, Page,
    Section, SignIn, Slot, Snooze,
};
pub use table::{Cell, Column, Table};
