//! The page templates and their view types. Every page is a [`Page`]: a navigation bar, a row
//! of headline figures and sections of charts, MIG maps and tables.

use askama::Template;

use crate::chart::Chart;
#[allow(unused_imports)] // The template matches on it.
use crate::table::{Cell, Table};

/// The bar above every page: where you are, who you are, the period shown.
#[derive(Debug, Clone, PartialEq)]
pub struct Nav {
    /// The current page's path (`/tenants`), to mark it.
    pub current: &'static str,
    /// Who is signed in (`finance`, `tenant:team-a`).
    pub who: String,
    /// Whether the pages that show fleet data are linked (not for a tenant).
    pub fleet_pages: bool,
    /// The period as shown (`November 2026`).
    pub period: String,
    /// The period's query (`month=2026-11`), kept on every link.
    pub query: String,
    /// The previous and next month's queries.
    pub prev: String,
    /// The next month's query.
    pub next: String,
    /// The sign-out form's CSRF token; `None` when signed in by a bearer token or a proxy.
    pub csrf: Option<String>,
}

impl Nav {
    /// The links, as (path, label, current).
    pub fn links(&self) -> Vec<(&'static str, &'static str, bool)> {
        let mut out = vec![("/", "Overview"), ("/tenants", "Tenants")];
        if self.fleet_pages {
            out.push(("/fleet", "Fleet"));
        }
        out.push(("/hoarding", "Hoarding"));
        out.push(("/rightsizing", "Rightsizing"));
        out.push(("/prices", "Prices"));
        out.into_iter()
            .map(|(p, l)| (p, l, p == self.current))
            .collect()
    }
}

/// A headline figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Kpi {
    /// What it is.
    pub label: String,
    /// The figure, formatted.
    pub value: String,
    /// A second line (its money, its share).
    pub sub: String,
    /// Its exact value, for tests and scripts (`data-value`).
    pub exact: String,
}

/// One instance or free slot range of a GPU's MIG layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    /// First placement slot (0–7).
    pub start: u32,
    /// Slots it covers.
    pub size: u32,
    /// Shown inside (tenant, or "free").
    pub label: String,
    /// `t0`…`t9` (a tenant's colour), `unheld`, `free` or `stranded`.
    pub class: String,
    /// Tooltip.
    pub title: String,
}

/// A GPU drawn as its eight placement slots.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuLayout {
    /// Node.
    pub node: String,
    /// UUID.
    pub gpu_uuid: String,
    /// Model.
    pub gpu_model: String,
    /// Its instances and free slots, by start.
    pub slots: Vec<Slot>,
    /// A note (stranded capacity, advice).
    pub note: String,
}

impl GpuLayout {
    /// Width of one placement slot in the drawing.
    pub const SLOT_W: f64 = 40.0;

    /// A slot's left edge.
    pub fn x(&self, s: &Slot) -> f64 {
        f64::from(s.start) * Self::SLOT_W
    }

    /// A slot's width.
    pub fn w(&self, s: &Slot) -> f64 {
        f64::from(s.size) * Self::SLOT_W - 2.0
    }

    /// Each placement slot's number and where it is written.
    pub fn slot_numbers(&self) -> Vec<(f64, u32)> {
        (0..8u32)
            .map(|i| ((f64::from(i) + 0.5) * Self::SLOT_W, i))
            .collect()
    }

    /// Where a slot's label goes.
    pub fn cx(&self, s: &Slot) -> f64 {
        self.x(s) + self.w(s) / 2.0
    }
}

/// A form that snoozes reclaim for one workload (an admin's session only): posted with the
/// session's CSRF token.
#[derive(Debug, Clone, PartialEq)]
pub struct Snooze {
    /// Where it posts.
    pub action: String,
    /// The session's CSRF token.
    pub csrf: String,
    /// The tenant.
    pub tenant: String,
    /// The workload.
    pub workload: String,
    /// Where to return.
    pub next: String,
}

impl Snooze {
    /// The durations offered, as (value, label).
    pub fn durations(&self) -> [(&'static str, &'static str); 4] {
        [
            ("1h", "1 hour"),
            ("8h", "8 hours"),
            ("1d", "1 day"),
            ("7d", "7 days"),
        ]
    }
}

/// A part of a page.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    /// Its heading.
    pub heading: String,
    /// A sentence under it (what the numbers mean).
    pub intro: String,
    /// A chart of the table's numbers.
    pub chart: Option<Chart>,
    /// MIG layouts (the Fleet page).
    pub layouts: Vec<GpuLayout>,
    /// The numbers.
    pub table: Option<Table>,
    /// Snooze forms (admins, on the Hoarding page).
    pub snoozes: Vec<Snooze>,
    /// A form that narrows the section (the Fleet page's node, model and tenant).
    pub filter: Option<FilterForm>,
    /// The link to the section's next page, where it has one.
    pub more: Option<MoreLink>,
}

/// A GET form that narrows a paged section; the period rides along as hidden fields.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterForm {
    /// The page's path.
    pub action: String,
    /// Parameters kept as they are (the period, the cost options).
    pub hidden: Vec<(String, String)>,
    /// The text fields, each with its value now.
    pub fields: Vec<FilterField>,
}

/// One field of a [`FilterForm`].
#[derive(Debug, Clone, PartialEq)]
pub struct FilterField {
    /// The query parameter.
    pub name: &'static str,
    /// Its label.
    pub label: &'static str,
    /// Its value now (empty: not filtered).
    pub value: String,
}

/// A paged section's way on.
#[derive(Debug, Clone, PartialEq)]
pub struct MoreLink {
    /// The next page's URL.
    pub href: String,
    /// What it shows ("Next 100 GPUs").
    pub label: String,
}

impl Section {
    /// A section with a table.
    pub fn table(heading: impl Into<String>, intro: impl Into<String>, table: Table) -> Section {
        Section {
            heading: heading.into(),
            intro: intro.into(),
            chart: None,
            layouts: Vec::new(),
            table: Some(table),
            snoozes: Vec::new(),
            filter: None,
            more: None,
        }
    }

    /// The same with a chart above the table.
    pub fn with_chart(mut self, chart: Chart) -> Section {
        self.chart = Some(chart);
        self
    }
}

/// Every page.
#[derive(Template, Debug, Clone)]
#[template(path = "page.html")]
pub struct Page {
    /// The navigation bar.
    pub nav: Nav,
    /// The page's title.
    pub title: String,
    /// Headline figures.
    pub kpis: Vec<Kpi>,
    /// The sections.
    pub sections: Vec<Section>,
}

/// The sign-in page.
#[derive(Template, Debug, Clone)]
#[template(path = "signin.html")]
pub struct SignIn {
    /// Why the last attempt failed.
    pub error: Option<String>,
    /// Where to go after signing in.
    pub next: String,
}

/// A keep button: posts `duration = value`.
#[derive(Debug, Clone, PartialEq)]
pub struct KeepButton {
    /// The duration as configured (`4h`).
    pub value: String,
    /// Its words (`Keep 4 h`).
    pub label: String,
    /// The one a chat button asked for (`?d=4h`): only marked, never posted.
    pub highlighted: bool,
}

/// The page of a keep link (`GET /keep/{token}`): one episode and nothing else, readable
/// without sign-in.
#[derive(Template, Debug, Clone)]
#[template(path = "keep.html")]
pub struct Keep {
    /// The workload.
    pub workload: String,
    /// Its tenant.
    pub tenant: String,
    /// Its owner, in a few words.
    pub owner: Option<String>,
    /// The node.
    pub node: String,
    /// The GPU (model, MIG profile).
    pub gpu: String,
    /// How long it has been idle.
    pub idle_for: String,
    /// Its idle cost so far, with the currency.
    pub idle_cost: String,
    /// When it will be reclaimed, in words.
    pub deadline: String,
    /// The end of a keep in force (RFC 3339).
    pub kept_until: Option<String>,
    /// Kept through links so far, in words.
    pub used: String,
    /// The per-episode bound, in words.
    pub bound: String,
    /// The buttons (none once the bound is reached).
    pub buttons: Vec<KeepButton>,
    /// Where the form posts.
    pub action: String,
    /// The form's token.
    pub form: String,
    /// The minute the form token was issued.
    pub form_t: String,
    /// A sentence about the last answer (the bound reached).
    pub message: Option<String>,
}

/// The page of a keep link that is refused (403, 410): why, in a sentence.
#[derive(Template, Debug, Clone)]
#[template(path = "keep_refused.html")]
pub struct KeepRefused {
    /// The heading.
    pub title: String,
    /// Why.
    pub why: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Column;

    fn nav() -> Nav {
        Nav {
            current: "/tenants",
            who: "viewer".into(),
            fleet_pages: true,
            period: "November 2026".into(),
            query: "month=2026-11".into(),
            prev: "month=2026-10".into(),
            next: "month=2026-12".into(),
            csrf: Some("c5rf".into()),
        }
    }

    #[test]
    fn the_keep_page_escapes_every_value() {
        let evil = "<script>alert(1)</script>".to_owned();
        let page = Keep {
            workload: evil.clone(),
            tenant: evil.clone(),
            owner: Some(evil.clone()),
            node: evil.clone(),
            gpu: evil.clone(),
            idle_for: evil.clone(),
            idle_cost: evil.clone(),
            deadline: evil.clone(),
            kept_until: Some(evil.clone()),
            used: evil.clone(),
            bound: evil.clone(),
            buttons: vec![KeepButton {
                value: evil.clone(),
                label: evil.clone(),
                highlighted: true,
            }],
            action: evil.clone(),
            form: evil.clone(),
            form_t: evil.clone(),
            message: Some(evil.clone()),
        }
        .render()
        .unwrap();
        assert!(!page.contains("<script>"), "{page}");
        let refused = KeepRefused {
            title: evil.clone(),
            why: evil,
        }
        .render()
        .unwrap();
        assert!(!refused.contains("<script>"));
    }

    #[test]
    fn every_value_is_escaped() {
        let evil = "<script>alert(1)</script>";
        let mut t = Table::new("tenants", vec![Column::text("tenant", "Tenant")]);
        t.rows
            .push(vec![Cell::link(evil, format!("/tenants/{evil}"))]);
        let page = Page {
            nav: Nav {
                who: format!("tenant:{evil}"),
                ..nav()
            },
            title: evil.into(),
            kpis: vec![Kpi {
                label: evil.into(),
                value: evil.into(),
                sub: evil.into(),
                exact: evil.into(),
            }],
            sections: vec![Section::table(evil, evil, t)],
        }
        .render()
        .unwrap();
        assert!(!page.contains("<script>"), "{page}");
        assert!(
            page.contains("&#60;script&#62;alert(1)&#60;/script&#62;")
                || page.contains("&lt;script&gt;"),
            "{page}"
        );
    }

    #[test]
    fn a_page_has_its_nav_and_the_exact_values() {
        let mut t = Table::new("tenants", vec![Column::number("cost", "Cost")]);
        t.rows.push(vec![Cell::money("1234.50".into(), 123_450)]);
        let html = Page {
            nav: nav(),
            title: "Tenants".into(),
            kpis: vec![],
            sections: vec![Section::table("Bill", "", t)],
        }
        .render()
        .unwrap();
        assert!(html.contains(r#"data-value="1234.50""#), "{html}");
        assert!(html.contains("1,234.50"));
        assert!(html.contains(r#"href="/tenants?month=2026-11""#), "{html}");
        assert!(html.contains(r#"name="csrf" value="c5rf""#), "{html}");
    }
}
