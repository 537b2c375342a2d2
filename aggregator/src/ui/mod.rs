//! The finance showback pages and their CSV exports: `/`, `/tenants`, `/tenants/{tenant}`,
//! `/fleet`, `/hoarding`, `/prices`, each for `month=YYYY-MM` or `from`/`to` (the current month
//! by default), and `?format=csv&table=<id>` for any table on them. The templates and view
//! types are in the `gpuledger-web` crate; these handlers fetch the typed analytics values and
//! turn them into tables ([`views`]), which the page and the CSV both render.
//!
//! Access ([`session`]): a bearer token, a session cookie from `/signin`, or a trusted proxy's
//! header. A `tenant:` reader is given only its own rows on every page and export — the
//! queries take its tenant (trend, episodes, breakdowns) or its line is cut out of the bill
//! computed for the fleet ([`gpuledger_ledger::analytics::bill`]) — and never the fleet pages.

pub mod keep;
pub mod period;

use askama::Template;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use gpuledger_web::{
    Chart, FilterField, FilterForm, GpuLayout, Kpi, MoreLink, Nav, Page, Section, Series, SignIn,
    Slot,
};

use crate::api::AppState;
use crate::api::extract::{Month, Query, Reader as ApiReader, Time};
use crate::api::showback::showback_error;
use crate::auth::Role;
use crate::auth::session::{self, Reader};
use crate::error::{ApiError, Form};
use crate::render::{csv_response, views};
use gpuledger_ledger::analytics::bill::{self, Bill, Money};
use gpuledger_ledger::analytics::prices::{CostMode, IdleSharing};
use gpuledger_ledger::analytics::showback::{self, GroupBy};
use gpuledger_ledger::analytics::{self, EpisodeState};
use period::Period;

/// The parameters every page takes.
/// The query every page takes: its period, its cost options, how to sort, and CSV.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// A calendar month (the current one by default).
    pub month: Option<Month>,
    /// Or a range's start.
    pub from: Option<Time>,
    /// And its end.
    pub to: Option<Time>,
    /// A column of a sortable table.
    pub sort: Option<String>,
    /// asc (default) or desc.
    pub dir: Option<SortDir>,
    /// html (default) or csv.
    pub format: Option<PageFormat>,
    /// With format=csv: which table.
    pub table: Option<String>,
    /// allocation or usage (default: the configured one).
    pub mode: Option<CostMode>,
    /// overhead or share (default: the configured one).
    pub idle: Option<IdleSharing>,
    /// The Fleet page: only this node's GPUs.
    pub node: Option<String>,
    /// The Fleet page: only this model's GPUs.
    pub model: Option<String>,
    /// The Fleet and Hoarding pages: only this tenant's.
    pub tenant: Option<String>,
    /// A paged section: the page after this cursor (the "next" link's).
    pub after: Option<String>,
    /// The Hoarding page's second list (ended episodes): its page after this cursor.
    pub after_ended: Option<String>,
}

/// Episodes a page lists at a time.
const PAGE_EPISODES: usize = 100;

impl PageQuery {
    /// A filter as given, an empty field (a form left blank) as none.
    fn given(v: &Option<String>) -> Option<String> {
        v.as_deref().filter(|s| !s.is_empty()).map(str::to_owned)
    }
}

/// A sort direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SortDir {
    /// Ascending.
    Asc,
    /// Descending.
    Desc,
}

/// What a page answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PageFormat {
    /// The page.
    Html,
    /// One of its tables as CSV.
    Csv,
}

/// The query of `GET /api/v1/bill`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BillQuery {
    /// A calendar month (the current one by default).
    pub month: Option<Month>,
    /// Or a range's start.
    pub from: Option<Time>,
    /// And its end.
    pub to: Option<Time>,
    /// allocation or usage (default: the configured one).
    pub mode: Option<CostMode>,
    /// overhead or share (default: the configured one).
    pub idle: Option<IdleSharing>,
}

/// The query of `GET /signin`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignInQuery {
    /// Where to go after signing in (a local path only).
    pub next: Option<String>,
}

/// A page's request: who, which period, and how to answer.
struct Request {
    reader: Reader,
    tenant: Option<String>,
    period: Period,
    q: PageQuery,
}

impl Request {
    fn nav(&self, current: &'static str) -> Nav {
        Nav {
            current,
            who: self.reader.label(),
            fleet_pages: self.tenant.is_none(),
            period: self.period.label.clone(),
            query: self.period.query.clone(),
            prev: self.period.prev.clone(),
            next: self.period.next.clone(),
            csrf: self.reader.csrf.clone(),
        }
    }

    fn csv_wanted(&self) -> Result<Option<&str>, ApiError> {
        match self.q.format {
            None | Some(PageFormat::Html) => Ok(None),
            Some(PageFormat::Csv) => self
                .q
                .table
                .as_deref()
                .map(Some)
                .ok_or_else(|| ApiError::bad_request("table", "format=csv needs table=<id>")),
        }
    }

    fn mode(&self, app: &AppState) -> Result<(CostMode, IdleSharing), ApiError> {
        Ok(cost_options(
            self.q.mode,
            self.q.idle,
            &app.config.analytics.billing,
        ))
    }

    /// The period's query plus the cost options, the filters and the cursor, for links and CSV
    /// (a table's CSV is the page shown).
    fn query(&self) -> String {
        let mut q = self.query_from(None);
        for (name, v) in [
            ("after", &self.q.after),
            ("after_ended", &self.q.after_ended),
        ] {
            if let Some(c) = PageQuery::given(v) {
                q.push_str(&format!("&{name}={}", views::segment(&c)));
            }
        }
        q
    }

    /// [`Request::query`] from the page after `after` (`None`: the first).
    fn query_from(&self, after: Option<&str>) -> String {
        let mut q = self.base_query();
        for (name, v) in [
            ("node", &self.q.node),
            ("model", &self.q.model),
            ("tenant", &self.q.tenant),
        ] {
            if let Some(v) = PageQuery::given(v) {
                q.push_str(&format!("&{name}={}", views::segment(&v)));
            }
        }
        if let Some(a) = after {
            q.push_str(&format!("&after={}", views::segment(a)));
        }
        q
    }

    /// The period's query plus the cost options.
    fn base_query(&self) -> String {
        let mut q = self.period.query.clone();
        if let Some(m) = self.q.mode {
            q.push_str(&format!("&mode={}", m.as_str()));
        }
        if let Some(i) = self.q.idle {
            q.push_str(&format!("&idle={}", i.as_str()));
        }
        q
    }
}

/// `mode` and `idle` as asked, or the configured defaults.
fn cost_options(
    mode: Option<CostMode>,
    idle: Option<IdleSharing>,
    billing: &bill::BillingSettings,
) -> (CostMode, IdleSharing) {
    (
        mode.unwrap_or(billing.cost_mode),
        idle.unwrap_or(billing.idle),
    )
}

/// The period as the request gave it (`month`, `from`, `to`), for the way back after sign-in.
fn period_query(q: &PageQuery) -> String {
    use chrono::TimeZone;
    let month = q.month.and_then(|Month(start, _)| {
        chrono::Utc
            .timestamp_opt(start, 0)
            .single()
            .map(|t| format!("month={}", t.format("%Y-%m")))
    });
    let from = q.from.map(|Time(t)| format!("from={t}"));
    let to = q.to.map(|Time(t)| format!("to={t}"));
    [month, from, to]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("&")
}

/// Who is asking and for what; `Err(redirect)` to the sign-in page when nobody is signed in.
fn request(
    app: &AppState,
    headers: &HeaderMap,
    q: PageQuery,
    path: &str,
) -> Result<Result<Request, Response>, ApiError> {
    let period = period::period(
        q.month,
        q.from,
        q.to,
        chrono::Utc::now().timestamp(),
        app.config.retention.rollup_secs,
    )?;
    let Some(reader) = session::reader(headers, &app.tokens, &app.sessions, &app.config.ui)? else {
        let back = format!("{path}?{}", period_query(&q));
        return Ok(Err(Redirect::to(&format!(
            "/signin?next={}",
            views::segment(&back)
        ))
        .into_response()));
    };
    let tenant = reader.role.read_scope()?.map(str::to_owned);
    Ok(Ok(Request {
        reader,
        tenant,
        period,
        q,
    }))
}

/// Runs blocking reads on a reader connection.
async fn read<T: Send + 'static>(
    app: &AppState,
    f: impl FnOnce(&duckdb::Connection) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    tokio::task::spawn_blocking(move || f(&conn))
        .await
        .map_err(|e| ApiError::internal(&e))?
}

/// Workload rows a tenant's page shows; its CSV has every one.
const PAGE_WORKLOADS: usize = 100;

/// A tenant's workloads: on the page the costliest [`PAGE_WORKLOADS`] (a tenant may run thousands,
/// and the page stays the size of a page); its CSV, every one.
fn workloads_section(req: &Request, mut table: gpuledger_web::Table) -> Result<Section, ApiError> {
    let all = table.rows.len();
    let mut intro = String::new();
    if req.csv_wanted()?.is_none() && all > PAGE_WORKLOADS {
        table.sort_by("cost", true);
        table.rows.truncate(PAGE_WORKLOADS);
        intro = format!(
            "The {PAGE_WORKLOADS} costliest of its {all} workloads; the CSV has every one."
        );
    }
    Ok(Section::table("Workloads", intro, table))
}

/// A query string as (name, value) pairs, for the hidden fields of a GET form.
fn hidden_fields(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (decode(k), decode(v))
        })
        .collect()
}

fn raw_from(app: &AppState) -> i64 {
    chrono::Utc::now().timestamp() - app.config.retention.raw_secs
}

/// Finishes the sections ([`finish`]) and answers with the page, or one of its tables as CSV.
#[allow(clippy::too_many_arguments)]
fn render(
    req: &Request,
    nav: &'static str,
    path: &str,
    title: String,
    kpis: Vec<Kpi>,
    mut sections: Vec<Section>,
    sortable: &[&str],
    name: &str,
) -> Result<Response, ApiError> {
    finish(req, path, &mut sections, sortable)?;
    let page = Page {
        nav: req.nav(nav),
        title,
        kpis,
        sections,
    };
    answer(req, page, name)
}

/// The answer: the page, or one of its tables as CSV.
fn answer(req: &Request, page: Page, name: &str) -> Result<Response, ApiError> {
    if let Some(id) = req.csv_wanted()? {
        let table = page
            .sections
            .iter()
            .filter_map(|s| s.table.as_ref())
            .find(|t| t.id == id)
            .ok_or_else(|| {
                let ids: Vec<&str> = page
                    .sections
                    .iter()
                    .filter_map(|s| s.table.as_ref().map(|t| t.id))
                    .collect();
                ApiError::bad_request("table", format!("{id:?} is not one of {}", ids.join(", ")))
            })?;
        return Ok(csv_response(
            table,
            &format!("gpuledger-{name}-{id}-{}", req.period.query),
        ));
    }
    let mut page = page;
    for t in page.sections.iter_mut().filter_map(|s| s.table.as_mut()) {
        t.drop_csv_only();
    }
    let html = page.render().map_err(|e| ApiError::internal(&e))?;
    Ok(Html(html).into_response())
}

/// Gives every table its CSV link and, where sortable, applies the requested sort.
fn finish(
    req: &Request,
    path: &str,
    sections: &mut [Section],
    sortable: &[&str],
) -> Result<(), ApiError> {
    let q = req.query();
    for s in sections.iter_mut() {
        if let Some(t) = s.table.as_mut() {
            t.csv_href = Some(format!("{path}?{q}&format=csv&table={}", t.id));
            if sortable.contains(&t.id) {
                t.sort_href = Some(format!("{path}?{q}&"));
                if let Some(col) = req.q.sort.as_deref() {
                    let desc = req.q.dir == Some(SortDir::Desc);
                    if !t.sort_by(col, desc) {
                        return Err(ApiError::bad_request(
                            "sort",
                            format!("{col:?} is not a column of {}", t.id),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

fn kpi(label: &str, hours: f64, sub: String) -> Kpi {
    Kpi {
        label: label.into(),
        value: format!("{} GPU-h", gpuledger_web::Cell::hours(hours).shown()),
        sub,
        exact: hours.to_string(),
    }
}

fn money_kpi(label: &str, m: Money, currency: &str, sub: String) -> Kpi {
    Kpi {
        label: label.into(),
        value: format!(
            "{} {currency}",
            gpuledger_web::Cell::money(m.to_string(), m.0).shown()
        ),
        sub,
        exact: m.to_string(),
    }
}

/// Measured GPU energy per UTC day, charted (the fleet's, or one tenant's share).
fn energy_section(days: &[(i64, f64)], fleet: bool) -> Section {
    let cats: Vec<String> = days
        .iter()
        .map(|d| views::day_label(d.0)[5..].to_owned())
        .collect();
    let series = vec![Series {
        name: "energy".into(),
        class: "s0",
        values: days.iter().map(|d| d.1).collect(),
    }];
    Section::table(
        "Daily energy",
        if fleet {
            "kWh the GPUs used per UTC day, measured (schema/ANALYTICS.md, \"Energy and carbon\")."
        } else {
            "kWh of this tenant's slices per UTC day, measured and split by slices and SM activity."
        },
        views::daily_energy(days),
    )
    .with_chart(Chart::grouped("kWh per day", "kWh", &cats, &series))
}

/// The period's energy and CO₂e per tenant (one tenant's row for `tenant`), beside its cost.
async fn energy_table(
    app: &AppState,
    req: &Request,
    tenant: Option<String>,
) -> Result<gpuledger_web::Table, ApiError> {
    let (from, to) = (req.period.from, req.period.to);
    let settings = app.config.analytics.energy.clone();
    let e = read(app, move |c| {
        analytics::energy::energy(
            c,
            (from, to),
            analytics::energy::GroupBy::Tenant,
            tenant.as_deref(),
            &settings,
        )
        .map_err(|e| ApiError::internal(&e))
    })
    .await?;
    Ok(views::energy(&e, &req.query()))
}

fn trend_chart(days: &[analytics::trend::Day], fleet: bool) -> Chart {
    let cats: Vec<String> = days
        .iter()
        .map(|d| views::day_label(d.day)[5..].to_owned())
        .collect();
    let mut series = vec![
        Series {
            name: "allocated".into(),
            class: "s0",
            values: days.iter().map(|d| d.allocated_gpu_hours).collect(),
        },
        Series {
            name: "used".into(),
            class: "s1",
            values: days.iter().map(|d| d.used_gpu_hours).collect(),
        },
    ];
    if fleet {
        series.insert(
            0,
            Series {
                name: "capacity".into(),
                class: "s2",
                values: days
                    .iter()
                    .map(|d| d.capacity_gpu_hours.unwrap_or(0.0))
                    .collect(),
            },
        );
    }
    Chart::grouped("GPU-hours per day", "GPU-h", &cats, &series)
}

/// `GET /`: the period's headline figures, daily trend, top idle spenders, open episodes.
pub async fn overview(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Result<Response, ApiError> {
    let req = match request(&app, &headers, q, "/")? {
        Ok(r) => r,
        Err(redirect) => return Ok(redirect),
    };
    let (mode, idle) = req.mode(&app)?;
    let (from, to, tenant) = (req.period.from, req.period.to, req.tenant.clone());
    let settings = app.config.analytics.clone();
    let raw = raw_from(&app);
    let (bill, days, open, energy) = read(&app, move |c| {
        let b = bill::compute(c, from, to, &settings, raw, mode, idle, tenant.as_deref())
            .map_err(showback_error)?;
        let d = analytics::trend::daily(c, from, to, tenant.as_deref())
            .map_err(|e| ApiError::internal(&e))?;
        let energy = analytics::energy::daily_kwh(c, from, to, tenant.as_deref())
            .map_err(|e| ApiError::internal(&e))?;
        let o = analytics::episodes_page(
            c,
            EpisodeState::Open,
            from,
            to,
            tenant.as_deref(),
            &settings,
            None,
            PAGE_EPISODES,
        )
        .map_err(|e| ApiError::internal(&e))?;
        Ok((b, d, o, energy))
    })
    .await?;
    let (open, more_open) = open;
    let kpis = overview_kpis(&bill);
    let fleet = req.tenant.is_none();
    let mut top = views::bill_lines(&bill, &req.query());
    top.id = "top_idle";
    top.footer = None;
    top.sort_by("idle_cost", true);
    top.rows.truncate(10);
    let sections = vec![
        Section::table(
            "Daily trend",
            "GPU-hours per UTC day, from the hourly rollups.",
            views::trend(&days, fleet),
        )
        .with_chart(trend_chart(&days, fleet)),
        energy_section(&energy, fleet),
        Section::table(
            "Top idle spenders",
            "Tenants by the cost of GPU-hours they held but did not use.",
            top,
        ),
        Section {
            more: more_open.map(|_| MoreLink {
                href: format!("/hoarding?{}", req.query_from(None)),
                label: "Every open episode, on the Hoarding page".into(),
            }),
            ..Section::table(
                "Open hoarding episodes",
                format!(
                    "Allocations idle for longer than the detection window, still held{}.",
                    if more_open.is_some() {
                        format!(" (the first {PAGE_EPISODES} to start)")
                    } else {
                        String::new()
                    }
                ),
                views::episodes(&open, "open_episodes", &req.query()),
            )
        },
    ];
    render(
        &req,
        "/",
        "/",
        format!("Overview — {}", req.period.label),
        kpis,
        sections,
        &[],
        "overview",
    )
}

/// The overview's headline figures: the fleet's split of capacity (allocated, used, idle,
/// unallocated, stranded) when the bill has the fleet's figures, else a tenant's own.
fn overview_kpis(bill: &Bill) -> Vec<Kpi> {
    let cur = bill.currency.clone();
    let allocated: f64 = bill.lines.iter().map(|l| l.allocated_gpu_hours).sum();
    let used: f64 = bill.lines.iter().map(|l| l.used_gpu_hours).sum();
    let idle_cost: Money = bill.lines.iter().map(|l| l.idle_cost).sum();
    let charged: Money = bill.lines.iter().map(|l| l.total).sum();
    let mut kpis = Vec::new();
    if let (Some(cap), Some(o), Some(cost)) =
        (bill.capacity_gpu_hours, &bill.overhead, bill.fleet_cost)
    {
        kpis.push(kpi("Capacity", cap, format!("{} {cur} fleet cost", cost)));
        kpis.push(kpi(
            "Allocated",
            allocated,
            format!("{charged} {cur} charged to tenants"),
        ));
        kpis.push(kpi(
            "Used",
            used,
            format!("{:.1} % of allocated", pct(used, allocated)),
        ));
        kpis.push(kpi(
            "Idle (allocated, unused)",
            allocated - used,
            format!("{idle_cost} {cur} idle cost"),
        ));
        kpis.push(kpi(
            "Unallocated",
            o.unallocated_gpu_hours,
            format!("{} {cur}", o.unallocated_cost),
        ));
        kpis.push(kpi(
            "Stranded",
            o.stranded_gpu_hours,
            format!("{} {cur}", o.stranded_cost),
        ));
    } else {
        kpis.push(kpi("Allocated", allocated, String::new()));
        kpis.push(kpi(
            "Used",
            used,
            format!("{:.1} % of allocated", pct(used, allocated)),
        ));
        kpis.push(kpi(
            "Idle",
            allocated - used,
            format!("{idle_cost} {cur} idle cost"),
        ));
        kpis.push(money_kpi("Bill", charged, &cur, String::new()));
    }
    kpis
}

/// A tenant page's headline figures, from the tenant's line of the bill (none without one).
fn tenant_kpis(bill: &Bill) -> Vec<Kpi> {
    let mut kpis = Vec::new();
    if let Some(l) = bill.lines.first() {
        kpis.push(kpi("Allocated", l.allocated_gpu_hours, String::new()));
        kpis.push(kpi(
            "Used",
            l.used_gpu_hours,
            format!("{:.1} % efficiency", 100.0 * l.efficiency.unwrap_or(0.0)),
        ));
        kpis.push(money_kpi(
            "Idle cost",
            l.idle_cost,
            &bill.currency,
            String::new(),
        ));
        kpis.push(money_kpi(
            "Total",
            l.total,
            &bill.currency,
            l.budget
                .map(|b| format!("of {b} budget"))
                .unwrap_or_default(),
        ));
    }
    kpis
}

fn pct(a: f64, b: f64) -> f64 {
    if b > 0.0 { 100.0 * a / b } else { 0.0 }
}

/// `GET /tenants`: the bill, one line per tenant, sortable, with its reconciliation and the
/// org → team sub-totals.
pub async fn tenants(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Result<Response, ApiError> {
    let req = match request(&app, &headers, q, "/tenants")? {
        Ok(r) => r,
        Err(redirect) => return Ok(redirect),
    };
    let (mode, idle) = req.mode(&app)?;
    let (from, to, tenant) = (req.period.from, req.period.to, req.tenant.clone());
    let settings = app.config.analytics.clone();
    let raw = raw_from(&app);
    // A calendar month's page forecasts its budgets too.
    let month = req.period.query.starts_with("month=");
    let (bill, budgets) = read(&app, move |c| {
        let b = bill::compute(c, from, to, &settings, raw, mode, idle, tenant.as_deref())
            .map_err(showback_error)?;
        let f = month
            .then(|| {
                analytics::budgets::forecast(
                    c,
                    (from, to),
                    chrono::Utc::now().timestamp(),
                    &settings,
                    raw,
                    mode,
                    idle,
                    tenant.as_deref(),
                )
            })
            .transpose()
            .map_err(showback_error)?;
        Ok((b, f))
    })
    .await?;
    let mode_text = match (bill.cost_mode, bill.idle) {
        (CostMode::Allocation, IdleSharing::Overhead) => {
            "Tenants pay for the GPU-hours they held; capacity nobody held is platform overhead."
        }
        (CostMode::Allocation, IdleSharing::Share) => {
            "Tenants pay for the GPU-hours they held plus a share of the overhead in proportion to their cost."
        }
        (CostMode::Usage, IdleSharing::Overhead) => {
            "Tenants pay for the GPU-hours they used; their idle and capacity nobody held are platform overhead."
        }
        (CostMode::Usage, IdleSharing::Share) => {
            "Tenants pay for the GPU-hours they used plus a share of the overhead in proportion to their cost."
        }
    };
    let mut sections = vec![Section::table(
        "Bill",
        format!(
            "{mode_text} Amounts in {}, rounded so that the lines sum to the fleet's cost to the cent.",
            bill.currency
        ),
        views::bill_lines(&bill, &req.query()),
    )];
    if let Some(b) = budgets.filter(|b| !b.lines.is_empty()) {
        let over = b.lines.iter().filter(|l| l.forecast_ratio > 1.0).count();
        sections.push(Section::table(
            "Budgets",
            format!(
                "Spent this month and the month-end forecast: spent so far plus the last whole days' spend per day (at most seven) for the days left. {over} of {} budgeted tenants are forecast over.",
                b.lines.len()
            ),
            views::budgets(&b, &req.query()),
        ));
    }
    sections.push(Section::table(
        "Energy and carbon",
        "Measured GPU energy of each tenant's slices in the period, and its CO₂e at the configured carbon intensity (API: /api/v1/energy).",
        energy_table(&app, &req, req.tenant.clone()).await?,
    ));
    if let Some(r) = views::reconciliation(&bill) {
        sections.push(Section::table(
            "Reconciliation",
            "Capacity nobody held + holders' idle − what was shared out = the overhead line; tenants + the overhead line = the fleet's cost, to the cent.",
            r,
        ));
        sections.push(Section::table(
            "By org and team",
            "Sub-totals along the org → team → tenant hierarchy of the configuration.",
            views::rollups(&bill),
        ));
    }
    render(
        &req,
        "/tenants",
        "/tenants",
        format!("Tenants — {}", req.period.label),
        Vec::new(),
        sections,
        &["bill"],
        "tenants",
    )
}

/// `GET /tenants/{tenant}`: one tenant's daily chart, its use by GPU model and MIG profile, its
/// workloads and its hoarding episodes.
pub async fn tenant(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<PageQuery>,
) -> Result<Response, ApiError> {
    let path = format!("/tenants/{}", views::segment(&name));
    let req = match request(&app, &headers, q, &path)? {
        Ok(r) => r,
        Err(redirect) => return Ok(redirect),
    };
    if req.tenant.as_deref().is_some_and(|t| t != name) {
        return Err(ApiError::forbidden(
            "tenant",
            "a tenant: token reads only its own tenant",
        ));
    }
    let (mode, idle) = req.mode(&app)?;
    let (from, to) = (req.period.from, req.period.to);
    let settings = app.config.analytics.clone();
    let raw = raw_from(&app);
    let who = name.clone();
    let (bill, days, models, workloads, eps, reclaims) = read(&app, move |c| {
        let b = bill::compute(c, from, to, &settings, raw, mode, idle, Some(&who))
            .map_err(showback_error)?;
        let d =
            analytics::trend::daily(c, from, to, Some(&who)).map_err(|e| ApiError::internal(&e))?;
        let view = |by: GroupBy| -> Result<_, ApiError> {
            Ok(
                showback::showback(c, from, to, by, Some(&who), raw, &settings)
                    .map_err(showback_error)?
                    .view(by, from, to, settings.prices.currency.clone(), true),
            )
        };
        let e = analytics::episodes_page(
            c,
            EpisodeState::All,
            from,
            to,
            Some(&who),
            &settings,
            None,
            PAGE_EPISODES,
        )
        .map_err(|e| ApiError::internal(&e))?;
        let r = gpuledger_ledger::reclaim::records::decisions(c, from, to, Some(&who), 1000)
            .map_err(|e| ApiError::internal(&e))?;
        Ok((
            b,
            d,
            view(GroupBy::MigProfile)?,
            view(GroupBy::Workload)?,
            e,
            r,
        ))
    })
    .await?;
    let kpis = tenant_kpis(&bill);
    let sizing = rightsizing_of(&app, &req, Some(name.clone())).await?;
    let budget_section = budget_section(&app, &req, &name, mode).await?;
    let mut bill_table = views::bill_lines(&bill, &req.query());
    bill_table.footer = None;
    let mut sections = vec![
        Section::table("Bill", "This tenant's line of the bill.", bill_table),
        Section::table(
            "Energy and carbon",
            "Measured GPU energy of this tenant's slices in the period, and its CO₂e.",
            energy_table(&app, &req, Some(name.clone())).await?,
        ),
    ];
    sections.extend(budget_section);
    sections.extend([

        Section::table(
            "Daily allocated and used",
            "GPU-hours per UTC day.",
            views::trend(&days, false),
        )
        .with_chart(trend_chart(&days, false)),
        Section::table(
            "By GPU model and MIG profile",
            "",
            views::breakdown(&models, "by_profile"),
        ),
        workloads_section(&req, views::breakdown(&workloads, "workloads"))?,
        Section {
            more: eps.1.map(|_| MoreLink {
                href: format!(
                    "/hoarding?{}&tenant={}",
                    req.query_from(None),
                    views::segment(&name)
                ),
                label: "Every episode of this tenant, on the Hoarding page".into(),
            }),
            ..Section::table(
                "Hoarding episodes",
                "Idle allocations of this tenant that overlap the period.",
                views::episodes(&eps.0, "episodes", &req.query()),
            )
        },
        Section {
            more: (sizing.rows.len() > TENANT_RIGHTSIZING).then(|| MoreLink {
                href: format!(
                    "/rightsizing?{}&tenant={}",
                    req.query_from(None),
                    views::segment(&name)
                ),
                label: "Every row of this tenant, on the Rightsizing page".into(),
            }),
            heading: "Rightsizing".into(),
            ..rightsizing_section(
                &req,
                &sizing,
                TENANT_RIGHTSIZING,
                format!(
                    "Workloads whose measured demand fits a smaller MIG profile: {} {} over the period ({} per 30 days).",
                    sizing.totals.savings, sizing.currency, sizing.totals.savings_per_month
                ),
            )?
        },
        Section::table(
            "Reclaim actions",
            "What the reclaim policy decided about this tenant's idle allocations in the period (newest first, at most 1,000).",
            views::reclaims(&reclaims),
        ),
    ]);
    render(
        &req,
        "/tenants",
        &path,
        format!("{name} — {}", req.period.label),
        kpis,
        sections,
        &["workloads"],
        "tenant",
    )
}

/// A budgeted tenant's month on its page: its cost summed day by day against the budget line
/// (a calendar month's page only).
async fn budget_section(
    app: &AppState,
    req: &Request,
    tenant: &str,
    mode: CostMode,
) -> Result<Option<Section>, ApiError> {
    let budget = app
        .config
        .analytics
        .billing
        .tenants
        .get(tenant)
        .and_then(|t| t.monthly_budget);
    let Some(budget) = budget.filter(|_| req.period.query.starts_with("month=")) else {
        return Ok(None);
    };
    let (from, to) = (req.period.from, req.period.to);
    let settings = app.config.analytics.clone();
    let raw = raw_from(app);
    let who = tenant.to_owned();
    let days = read(app, move |c| {
        analytics::budgets::cumulative_cost(
            c,
            (from, to),
            chrono::Utc::now().timestamp(),
            &settings,
            raw,
            mode,
            &who,
        )
        .map_err(showback_error)
    })
    .await?;
    let currency = app.config.analytics.prices.currency.clone();
    let cats: Vec<String> = days
        .iter()
        .map(|d| views::day_label(d.0)[5..].to_owned())
        .collect();
    let chart = Chart::with_rule(
        "Cost to date against the monthly budget",
        currency.clone(),
        &cats,
        &[Series {
            name: "cost to date".into(),
            class: "s0",
            values: days.iter().map(|d| d.1).collect(),
        }],
        budget,
        format!("budget {budget} {currency}"),
    );
    Ok(Some(
        Section::table(
            "Budget",
            format!(
                "This tenant's own cost ({}) summed day by day from the month's start, against its monthly budget; shared overhead and shared-GPU transfers, which its bill total may add, are not in it.",
                mode.as_str()
            ),
            views::cumulative_cost(&days, budget),
        )
        .with_chart(chart),
    ))
}

/// `GET /hoarding`: every episode overlapping the period, with its idle cost.
pub async fn hoarding(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Result<Response, ApiError> {
    let req = match request(&app, &headers, q, "/hoarding")? {
        Ok(r) => r,
        Err(redirect) => return Ok(redirect),
    };
    let (from, to) = (req.period.from, req.period.to);
    // A tenant: reader sees its own; a fleet reader may narrow to one tenant.
    let tenant = req.tenant.clone().or(PageQuery::given(&req.q.tenant));
    let after_open =
        crate::api::hoarding::episode_cursor(PageQuery::given(&req.q.after).as_deref())?;
    let after_ended =
        crate::api::hoarding::episode_cursor(PageQuery::given(&req.q.after_ended).as_deref())?;
    let settings = app.config.analytics.clone();
    let now = chrono::Utc::now().timestamp();
    let (open, closed, (groups, all_groups), exempt) = read(&app, move |c| {
        let get = |s, after| {
            let totals = analytics::episode_totals(c, s, from, to, tenant.as_deref(), &settings)
                .map_err(|e| ApiError::internal(&e))?;
            let page = analytics::episodes_page(
                c,
                s,
                from,
                to,
                tenant.as_deref(),
                &settings,
                after,
                PAGE_EPISODES,
            )
            .map_err(|e| ApiError::internal(&e))?;
            Ok::<_, ApiError>((totals, page))
        };
        let groups = analytics::episode_groups(
            c,
            EpisodeState::All,
            (from, to),
            tenant.as_deref(),
            &settings,
            PAGE_EPISODES,
        )
        .map_err(|e| ApiError::internal(&e))?;
        let exempt = gpuledger_ledger::reclaim::records::exemptions(
            c,
            now,
            tenant.as_deref(),
            None,
            PAGE_EPISODES as i64,
        )
        .map_err(|e| ApiError::internal(&e))?;
        Ok((
            get(EpisodeState::Open, after_open)?,
            get(EpisodeState::Closed, after_ended)?,
            groups,
            exempt,
        ))
    })
    .await?;
    let ((open_count, open_cost), (open, open_next)) = open;
    let ((ended_count, ended_cost), (closed, ended_next)) = closed;
    let a = &app.config.analytics;
    let kpis = vec![
        money_kpi(
            "Open episodes' idle cost",
            Money::round(open_cost),
            &a.prices.currency,
            format!("{open_count} open"),
        ),
        money_kpi(
            "Ended episodes' idle cost",
            Money::round(ended_cost),
            &a.prices.currency,
            format!("{ended_count} ended"),
        ),
    ];
    let mut intro = format!(
        "An episode is an allocation whose SM activity stayed under {:.0} % for at least {} minutes.",
        100.0 * a.idle_threshold,
        a.window_secs() / 60
    );
    if open_count > open.len() as u64 {
        intro.push_str(&format!(
            " {} of the {open_count} open episodes, in the order they started.",
            open.len()
        ));
    }
    let mut open_section =
        Section::table("Open", intro, views::episodes(&open, "open", &req.query()));
    // Admins signed in with a session may snooze an open episode's workload from here.
    if let (Role::Admin, Some(csrf)) = (&req.reader.role, &req.reader.csrf) {
        let mut seen = std::collections::BTreeSet::new();
        for e in &open {
            if let (Some(t), Some(w)) = (&e.tenant, &e.workload)
                && seen.insert((t.clone(), w.clone()))
            {
                open_section.snoozes.push(gpuledger_web::Snooze {
                    action: "/hoarding/snooze".into(),
                    csrf: csrf.clone(),
                    tenant: t.clone(),
                    workload: w.clone(),
                    next: format!("/hoarding?{}", req.query()),
                });
            }
        }
    }
    // Each list pages on its own; the other list's place is kept in the link.
    let keep = |name: &str, v: &Option<String>| {
        PageQuery::given(v).map_or(String::new(), |c| format!("&{name}={}", views::segment(&c)))
    };
    open_section.more = open_next.map(|c| MoreLink {
        href: format!(
            "/hoarding?{}{}",
            req.query_from(Some(&c.encode())),
            keep("after_ended", &req.q.after_ended)
        ),
        label: format!("Next {PAGE_EPISODES} open episodes"),
    });
    let mut ended_section = Section::table(
        "Ended",
        if ended_count > closed.len() as u64 {
            format!(
                "{} of the {ended_count} ended episodes, in the order they started.",
                closed.len()
            )
        } else {
            String::new()
        },
        views::episodes(&closed, "closed", &req.query()),
    );
    ended_section.more = ended_next.map(|c| MoreLink {
        href: format!(
            "/hoarding?{}{}&after_ended={}",
            req.query_from(None),
            keep("after", &req.q.after),
            views::segment(&c.encode())
        ),
        label: format!("Next {PAGE_EPISODES} ended episodes"),
    });
    let by_workload = Section::table(
        "By tenant and workload",
        format!(
            "Every episode of the period summed per workload, the costliest first{}.",
            if all_groups > groups.len() {
                format!(" ({} of {all_groups} workloads)", groups.len())
            } else {
                String::new()
            }
        ),
        views::episode_groups(&groups, &req.query()),
    );
    let exemptions = Section::table(
        "Exemptions in force",
        "Snoozes and keeps that hold reclaim now: by an admin, a tenant's token, or a notice's keep link (link).".to_owned(),
        views::exemptions(&exempt),
    );
    let sections = vec![by_workload, open_section, ended_section, exemptions];
    render(
        &req,
        "/hoarding",
        "/hoarding",
        format!("Hoarding — {}", req.period.label),
        kpis,
        sections,
        &["open", "closed"],
        "hoarding",
    )
}

/// Rightsizing rows a tenant's page lists (the Rightsizing page has the rest).
const TENANT_RIGHTSIZING: usize = 20;

/// Rightsizing rows a page lists; its CSV has every one.
const PAGE_RIGHTSIZING: usize = 100;

/// The page's period as whole minutes (rightsizing reads minutes): `from` up, `to` down.
fn whole_minutes(from: i64, to: i64) -> (i64, i64) {
    let up = from.div_euclid(60) * 60 + if from.rem_euclid(60) == 0 { 0 } else { 60 };
    (up, to.div_euclid(60) * 60)
}

/// Rightsizing over the page's period, for its tenant (or the one asked).
async fn rightsizing_of(
    app: &AppState,
    req: &Request,
    tenant: Option<String>,
) -> Result<analytics::rightsizing::Rightsizing, ApiError> {
    // To now at most: the month's future days hold nothing, and would shrink "per 30 days".
    let now = chrono::Utc::now().timestamp();
    let (from, to) = whole_minutes(req.period.from, req.period.to.min(now));
    let settings = app.config.analytics.clone();
    let raw = raw_from(app);
    let model = PageQuery::given(&req.q.model);
    let state = app.clone();
    read(app, move |c| {
        analytics::rightsizing::rightsizing(
            c,
            &state.demand,
            (from, to.max(from + 60)),
            &settings,
            raw,
            analytics::rightsizing::Filter {
                tenant: tenant.as_deref(),
                gpu_model: model.as_deref(),
            },
        )
        .map_err(showback_error)
    })
    .await
}

/// The rightsizing table of a page: the first `limit` rows by savings on the page, every row in
/// its CSV.
fn rightsizing_section(
    req: &Request,
    r: &analytics::rightsizing::Rightsizing,
    limit: usize,
    intro: String,
) -> Result<Section, ApiError> {
    let mut table = views::rightsizing(r, &req.query());
    let all = table.rows.len();
    let mut intro = intro;
    if req.csv_wanted()?.is_none() && all > limit {
        table.rows.truncate(limit);
        intro.push_str(&format!(
            " The {limit} greatest savings of {all} rows are listed; the CSV has every one."
        ));
    }
    Ok(Section::table("Recommendations", intro, table))
}

/// `GET /rightsizing`: per workload and MIG profile, the smallest profile its measured demand
/// fits and what moving there saves, the greatest savings first.
pub async fn rightsizing(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Result<Response, ApiError> {
    let req = match request(&app, &headers, q, "/rightsizing")? {
        Ok(r) => r,
        Err(redirect) => return Ok(redirect),
    };
    let asked = PageQuery::given(&req.q.tenant);
    if let (Some(own), Some(a)) = (&req.tenant, &asked)
        && own != a
    {
        return Err(ApiError::forbidden(
            "tenant",
            "a tenant: token reads only its own tenant",
        ));
    }
    let tenant = req.tenant.clone().or(asked);
    let r = rightsizing_of(&app, &req, tenant).await?;
    let s = &r.settings;
    let currency = r.currency.clone();
    let kpis = vec![
        money_kpi(
            "Potential savings",
            r.totals.savings,
            &currency,
            format!(
                "{} per 30 days, from {} recommendations",
                r.totals.savings_per_month, r.totals.recommendations
            ),
        ),
        Kpi {
            label: "Recommendations".into(),
            value: r.totals.recommendations.to_string(),
            sub: format!("of {} workload profiles", r.totals.rows),
            exact: r.totals.recommendations.to_string(),
        },
        Kpi {
            label: "Saturated".into(),
            value: r.totals.saturated.to_string(),
            sub: "use ≥ 95 % of their compute or memory".into(),
            exact: r.totals.saturated.to_string(),
        },
    ];
    let intro = format!(
        "Each workload's demand per minute (mean SM activity × the profile's compute slices), at the {} percentile ({}), with {} % compute and {} % memory headroom, against the MIG profiles of its GPU model; savings at the price book's prices for the instance-hours it held. Rows with under {} measured hours are not recommended anything.",
        s.percentile,
        if s.classes.is_empty() {
            "for every SLO class".to_owned()
        } else {
            let mut c: Vec<String> = s
                .classes
                .iter()
                .filter_map(|(k, v)| v.percentile.map(|p| format!("{k}: {p}")))
                .collect();
            c.sort();
            format!("classes: {}", c.join(", "))
        },
        s.compute_headroom * 100.0,
        s.memory_headroom * 100.0,
        s.min_measured_hours
    );
    let sections = vec![rightsizing_section(&req, &r, PAGE_RIGHTSIZING, intro)?];
    render(
        &req,
        "/rightsizing",
        "/rightsizing",
        format!("Rightsizing — {}", req.period.label),
        kpis,
        sections,
        &["rightsizing"],
        "rightsizing",
    )
}

/// `GET /prices`: the price book in force during the period.
pub async fn prices(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Result<Response, ApiError> {
    let req = match request(&app, &headers, q, "/prices")? {
        Ok(r) => r,
        Err(redirect) => return Ok(redirect),
    };
    let book = &app.config.analytics.prices;
    let rows = book.in_force(req.period.from, req.period.to);
    let sections = vec![Section::table(
        "Price book",
        format!(
            "Prices in {} per hour: per GPU-hour for a model, per instance-hour for a MIG profile. A model not listed costs {} per GPU-hour. A price change inside the period splits the bill at that instant.",
            book.currency, book.default_per_gpu_hour
        ),
        views::prices(&rows),
    )];
    render(
        &req,
        "/prices",
        "/prices",
        format!("Prices — {}", req.period.label),
        Vec::new(),
        sections,
        &[],
        "prices",
    )
}

/// A tenant's colour class, stable across pages.
fn tenant_class(t: &str) -> String {
    let h = t
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    format!("t{}", h % 10)
}

fn layout(g: &analytics::fleet::GpuAt) -> GpuLayout {
    let mut slots: Vec<Slot> = g
        .instances
        .iter()
        .map(|i| {
            let size = i
                .mig_profile
                .as_deref()
                .and_then(|p| gpuledger_schema::mig::model(&g.gpu_model)?.profile(p))
                .map_or(8, |p| p.size);
            let (label, class) = match &i.tenant {
                Some(t) => (t.clone(), tenant_class(t)),
                None => ("unheld".to_owned(), "unheld".to_owned()),
            };
            Slot {
                start: i.placement_start.map_or(0, |s| s.max(0) as u32),
                size,
                title: format!(
                    "{} {} {}",
                    i.mig_profile.as_deref().unwrap_or("whole GPU"),
                    i.tenant.as_deref().unwrap_or("nobody"),
                    i.workload.as_deref().unwrap_or("")
                ),
                label,
                class,
            }
        })
        .collect();
    let stranded = g.stranded_gpu_equivalents > 0.0;
    for &s in &g.free_slots {
        slots.push(Slot {
            start: s,
            size: 1,
            label: "free".into(),
            class: if stranded { "stranded" } else { "free" }.into(),
            title: format!("slot {s} free{}", if stranded { ", stranded" } else { "" }),
        });
    }
    slots.sort_by_key(|s| s.start);
    GpuLayout {
        node: g.node.clone(),
        gpu_uuid: g.gpu_uuid.clone(),
        gpu_model: g.gpu_model.clone(),
        slots,
        note: if stranded {
            format!("{:.2} GPUs stranded", g.stranded_gpu_equivalents)
        } else {
            String::new()
        },
    }
}

/// `GET /fleet`: every GPU's MIG layout (now, or at the period's end if it is past), stranded
/// capacity per day, and the re-geometry advice. Not for tenant readers.
pub async fn fleet(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Result<Response, ApiError> {
    let req = match request(&app, &headers, q, "/fleet")? {
        Ok(r) => r,
        Err(redirect) => return Ok(redirect),
    };
    if req.tenant.is_some() {
        return Err(ApiError::forbidden(
            "authorization",
            "the fleet page is fleet data; a tenant: token cannot read it",
        ));
    }
    let (from, to) = (req.period.from, req.period.to);
    let settings = app.config.analytics.clone();
    let filter = analytics::fleet::GpuFilter {
        node: PageQuery::given(&req.q.node),
        model: PageQuery::given(&req.q.model),
        tenant: PageQuery::given(&req.q.tenant),
    };
    let page = analytics::fleet::GpuPage {
        after: match PageQuery::given(&req.q.after) {
            None => None,
            Some(c) => Some(analytics::fleet::decode_cursor(&c).ok_or_else(|| {
                ApiError::bad_request("after", "not a cursor this page gave (its next link)")
            })?),
        },
        limit: analytics::fleet::DEFAULT_PAGE_GPUS,
    };
    let (now, days, at) = read(&app, move |c| {
        let (at, max_age) =
            analytics::fleet::period_instant(c, from, to, chrono::Utc::now().timestamp())
                .map_err(|e| ApiError::internal(&e))?
                .unwrap_or((to - 1, analytics::fleet::MAX_AGE_SECS));
        let f = analytics::fleet::at_instant(c, at, max_age, &settings, &filter, &page)
            .map_err(|e| ApiError::internal(&e))?;
        let d = analytics::trend::daily(c, from, to, None).map_err(|e| ApiError::internal(&e))?;
        Ok((f, d, at))
    })
    .await?;
    let kpis = vec![
        Kpi {
            label: "GPUs".into(),
            value: now.fleet.gpus.to_string(),
            sub: format!("as at {}", gpuledger_web::Cell::time(Some(at)).shown()),
            exact: now.fleet.gpus.to_string(),
        },
        Kpi {
            label: "Free".into(),
            value: format!("{:.2} GPUs", now.fleet.free_gpu_equivalents),
            sub: String::new(),
            exact: now.fleet.free_gpu_equivalents.to_string(),
        },
        Kpi {
            label: "Stranded".into(),
            value: format!("{:.2} GPUs", now.fleet.stranded_gpu_equivalents),
            sub: format!("{:.1} % of the fleet", 100.0 * now.fleet.stranded_ratio),
            exact: now.fleet.stranded_gpu_equivalents.to_string(),
        },
    ];
    let cats: Vec<String> = days
        .iter()
        .map(|d| views::day_label(d.day)[5..].to_owned())
        .collect();
    let stranded_chart = Chart::grouped(
        "Stranded GPU-hours per day",
        "GPU-h",
        &cats,
        &[Series {
            name: "stranded".into(),
            class: "s3",
            values: days
                .iter()
                .map(|d| d.stranded_gpu_hours.unwrap_or(0.0))
                .collect(),
        }],
    );
    let shown = if now.next.is_some() || req.q.after.is_some() {
        format!(
            "{} of the {} GPUs, by node and UUID",
            now.gpus.len(),
            now.fleet.gpus
        )
    } else {
        format!("All {} GPUs", now.fleet.gpus)
    };
    let mut map = Section::table(
        "MIG layouts",
        format!(
            "{shown}. Each GPU as its eight placement slots: instances coloured by tenant, unheld instances grey, free slots dashed, stranded ones red."
        ),
        views::gpus(&now),
    );
    map.layouts = now.gpus.iter().map(layout).collect();
    map.filter = Some(FilterForm {
        action: "/fleet".into(),
        hidden: hidden_fields(&req.base_query()),
        fields: vec![
            FilterField {
                name: "node",
                label: "Node",
                value: req.q.node.clone().unwrap_or_default(),
            },
            FilterField {
                name: "model",
                label: "Model",
                value: req.q.model.clone().unwrap_or_default(),
            },
            FilterField {
                name: "tenant",
                label: "Tenant",
                value: req.q.tenant.clone().unwrap_or_default(),
            },
        ],
    });
    map.more = now.next.as_deref().map(|cursor| MoreLink {
        href: format!("/fleet?{}", req.query_from(Some(cursor))),
        label: format!("Next {} GPUs", analytics::fleet::DEFAULT_PAGE_GPUS),
    });
    let sections = vec![
        Section::table(
            "By model",
            "Every GPU the filter keeps, per model.",
            views::models(&now.models),
        ),
        map,
        Section::table(
            "Nodes on this page",
            "Each node's totals over all of its GPUs the filter keeps.",
            views::nodes(&now.nodes),
        ),
        Section::table(
            "Stranded capacity over time",
            "Free capacity the demand mix cannot use, per UTC day.",
            views::trend(&days, true),
        )
        .with_chart(stranded_chart),
        Section::table(
            "Re-geometry advice",
            "Layouts that would strand less, for the GPUs on this page.",
            views::advice(&now.advice),
        ),
    ];
    render(
        &req,
        "/fleet",
        "/fleet",
        format!("Fleet — {}", req.period.label),
        kpis,
        sections,
        &["gpus"],
        "fleet",
    )
}

/// `GET /signin`.
pub async fn signin_page(Query(q): Query<SignInQuery>) -> Response {
    let next = safe_next(q.next.as_deref());
    match (SignIn { error: None, next }).render() {
        Ok(h) => Html(h).into_response(),
        Err(e) => ApiError::internal(&e).into_response(),
    }
}

/// Only a local path may be the target after sign-in (no open redirect): one `/`, then visible
/// ASCII only. A browser drops tabs and newlines from a URL and reads `\` as `/`, so
/// `/\t/host` and `/\\host` would leave the site; neither can pass, and the answer's
/// `Location` header is always valid.
pub fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && n.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') =>
        {
            n.to_owned()
        }
        _ => "/".to_owned(),
    }
}

/// The sign-in form.
#[derive(serde::Deserialize)]
pub struct SignInForm {
    token: String,
    #[serde(default)]
    next: Option<String>,
}

/// `POST /signin`: exchanges a token for a session cookie.
pub async fn signin(
    State(app): State<AppState>,
    headers: HeaderMap,
    Form(f): Form<SignInForm>,
) -> Result<Response, ApiError> {
    session::same_origin(&headers)?;
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&format!("Bearer {}", f.token.trim())) {
        h.insert(header::AUTHORIZATION, v);
    }
    let role = match app.tokens.authenticate(&h) {
        Ok(r @ (Role::Admin | Role::Viewer | Role::Tenant(_))) => r,
        Ok(_) | Err(_) => {
            let page = SignIn {
                error: Some("That token is unknown, or it is an exporter (node) token.".into()),
                next: safe_next(f.next.as_deref()),
            };
            let html = page.render().map_err(|e| ApiError::internal(&e))?;
            return Ok((StatusCode::UNAUTHORIZED, Html(html)).into_response());
        }
    };
    let (id, _) = app
        .sessions
        .create(role, app.config.ui.session_ttl)
        .map_err(|e| ApiError::internal(&format!("no random session id: {e}")))?;
    let mut r = Redirect::to(&safe_next(f.next.as_deref())).into_response();
    if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&id, &app.config.ui)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

/// The sign-out form.
#[derive(serde::Deserialize)]
pub struct SignOutForm {
    csrf: String,
}

/// `POST /signout`: ends the session (CSRF-checked).
pub async fn signout(
    State(app): State<AppState>,
    headers: HeaderMap,
    Form(f): Form<SignOutForm>,
) -> Result<Response, ApiError> {
    session::same_origin(&headers)?;
    let reader = session::reader(&headers, &app.tokens, &app.sessions, &app.config.ui)?
        .ok_or_else(|| ApiError::unauthorized("not signed in"))?;
    session::check_csrf(&reader, &f.csrf)?;
    if let Some(id) = session::session_id(&headers) {
        app.sessions.remove(&id);
    }
    let mut r = Redirect::to("/signin").into_response();
    if let Ok(v) = HeaderValue::from_str(&session::clear_cookie(&app.config.ui)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

/// The Hoarding page's snooze form.
#[derive(serde::Deserialize)]
pub struct SnoozeForm {
    csrf: String,
    tenant: String,
    workload: String,
    duration: String,
    #[serde(default)]
    next: Option<String>,
}

/// `POST /hoarding/snooze`: keeps a workload from reclaim for a while (an exemption, as
/// `POST /api/v1/exemptions`). Pages write only for an admin's session: same origin, CSRF
/// token checked.
pub async fn snooze(
    State(app): State<AppState>,
    headers: HeaderMap,
    Form(f): Form<SnoozeForm>,
) -> Result<Response, ApiError> {
    session::same_origin(&headers)?;
    let reader = session::reader(&headers, &app.tokens, &app.sessions, &app.config.ui)?
        .ok_or_else(|| ApiError::unauthorized("not signed in"))?;
    session::check_csrf(&reader, &f.csrf)?;
    reader.role.require_admin()?;
    let req = gpuledger_ledger::reclaim::records::NewExemption {
        tenant: Some(f.tenant),
        workload: Some(f.workload),
        duration: f.duration,
        reason: None,
    };
    crate::api::reclaim::add_exemption(&app, &reader.role, req, "snoozed on the Hoarding page")
        .await?;
    Ok(Redirect::to(&safe_next(f.next.as_deref())).into_response())
}

/// `GET /api/v1/bill` (JSON) — the Tenants page's value.
pub async fn bill_json(
    State(app): State<AppState>,
    reader: ApiReader,
    Query(q): Query<BillQuery>,
) -> Result<Response, ApiError> {
    let tenant = reader.scope;
    let period = period::period(
        q.month,
        q.from,
        q.to,
        chrono::Utc::now().timestamp(),
        app.config.retention.rollup_secs,
    )?;
    let (mode, idle) = cost_options(q.mode, q.idle, &app.config.analytics.billing);
    let (from, to) = (period.from, period.to);
    let settings = app.config.analytics.clone();
    let raw = raw_from(&app);
    let bill = read(&app, move |c| {
        bill::compute(c, from, to, &settings, raw, mode, idle, tenant.as_deref())
            .map_err(showback_error)
    })
    .await?;
    Ok(axum::Json(bill).into_response())
}

#[cfg(test)]
mod tests {
    use super::safe_next;

    /// Regression: `next=/%09/host/page` (a tab) passed the local-path check, and the browser,
    /// which drops tabs, went to `//host/page`; `next=/%0A/evil` was a 500 (not a header value).
    #[test]
    fn open_redirect_after_sign_in_is_refused() {
        for bad in [
            "/\t/127.0.0.2:19950/pwned.html",
            "/\n/evil",
            "/\r\n/evil",
            "/\\/evil",
            "/\\evil",
            "//evil",
            "https://evil",
            "evil",
            "/a b",
            "/é",
        ] {
            assert_eq!(safe_next(Some(bad)), "/", "{bad:?}");
        }
        for good in [
            "/",
            "/tenants/ml%2Fteam?month=2026-11",
            "/hoarding?from=0&to=1#x",
        ] {
            assert_eq!(safe_next(Some(good)), good);
        }
        assert_eq!(safe_next(None), "/");
    }
}
