//! A table as every page, and its CSV export, render it.

/// One column: `name` is the stable CSV header (snake_case, never renamed), `label` what a
/// person reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// The CSV header.
    pub name: &'static str,
    /// The page's header.
    pub label: &'static str,
    /// Right-aligned, sortable as a number.
    pub numeric: bool,
    /// In the CSV only: a page leaves it out to stay readable ([`Table::drop_csv_only`]).
    pub csv_only: bool,
}

impl Column {
    /// A text column.
    pub const fn text(name: &'static str, label: &'static str) -> Column {
        Column {
            name,
            label,
            numeric: false,
            csv_only: false,
        }
    }

    /// A numeric column.
    pub const fn number(name: &'static str, label: &'static str) -> Column {
        Column {
            name,
            label,
            numeric: true,
            csv_only: false,
        }
    }

    /// The same column, written to the CSV only.
    pub const fn csv_only(self) -> Column {
        Column {
            csv_only: true,
            ..self
        }
    }
}

/// One cell: what the CSV and `data-value` carry (`value`), and what the page shows.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Text (a name), optionally a link.
    Text {
        /// The text.
        text: String,
        /// Where it links to.
        href: Option<String>,
    },
    /// A number: its exact value and how it is shown.
    Number {
        /// The exact value (the CSV's).
        value: String,
        /// As shown (rounded, with a unit).
        shown: String,
        /// For sorting.
        key: f64,
    },
    /// No value (`null` in the JSON, empty in the CSV).
    Empty,
}

impl Cell {
    /// A plain text cell.
    pub fn text(s: impl Into<String>) -> Cell {
        Cell::Text {
            text: s.into(),
            href: None,
        }
    }

    /// A text cell linking to `href`.
    pub fn link(s: impl Into<String>, href: impl Into<String>) -> Cell {
        Cell::Text {
            text: s.into(),
            href: Some(href.into()),
        }
    }

    /// A text cell, or empty for `None`.
    pub fn opt_text(s: Option<impl Into<String>>) -> Cell {
        s.map_or(Cell::Empty, Cell::text)
    }

    /// GPU-hours: exact in the CSV, two decimals with thousands separators on the page.
    pub fn hours(h: f64) -> Cell {
        Cell::Number {
            value: h.to_string(),
            shown: group(&format!("{h:.2}")),
            key: h,
        }
    }

    /// An amount already rounded to the cent (`"1234.56"`), shown with thousands separators.
    pub fn money(decimal: String, cents: i64) -> Cell {
        Cell::Number {
            shown: group(&decimal),
            value: decimal,
            key: cents as f64,
        }
    }

    /// A ratio 0–1, shown as a percentage.
    pub fn ratio(r: Option<f64>) -> Cell {
        match r {
            Some(r) => Cell::Number {
                value: r.to_string(),
                shown: format!("{:.1} %", 100.0 * r),
                key: r,
            },
            None => Cell::Empty,
        }
    }

    /// A count.
    pub fn count(n: i64) -> Cell {
        Cell::Number {
            value: n.to_string(),
            shown: group(&n.to_string()),
            key: n as f64,
        }
    }

    /// A Unix time, shown as UTC (`2026-11-23 14:05`), exact in the CSV (RFC 3339).
    pub fn time(t: Option<i64>) -> Cell {
        match t.and_then(|t| chrono::DateTime::from_timestamp(t, 0)) {
            Some(d) => Cell::Number {
                value: d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                shown: d.format("%Y-%m-%d %H:%M").to_string(),
                key: t.unwrap_or_default() as f64,
            },
            None => Cell::Empty,
        }
    }

    /// As shown on a page.
    pub fn shown(&self) -> &str {
        match self {
            Cell::Text { text, .. } => text,
            Cell::Number { shown, .. } => shown,
            Cell::Empty => "",
        }
    }

    /// The exact value, as the CSV has it.
    pub fn value(&self) -> &str {
        match self {
            Cell::Text { text, .. } => text,
            Cell::Number { value, .. } => value,
            Cell::Empty => "",
        }
    }

    /// The cell as a CSV writes it for a spreadsheet: text that a spreadsheet would read as a
    /// formula (it begins with `=`, `+`, `-`, `@`, a tab or a carriage return: OWASP's list) gets
    /// a leading `'`, so it is shown as the text it is. Numbers are written as they are.
    pub fn csv_value(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Cell::Text { text, .. } if text.starts_with(['=', '+', '-', '@', '\t', '\r']) => {
                format!("'{text}").into()
            }
            cell => cell.value().into(),
        }
    }

    fn sort_key(&self) -> (u8, f64, &str) {
        match self {
            Cell::Empty => (0, 0.0, ""),
            Cell::Number { key, .. } => (1, *key, ""),
            Cell::Text { text, .. } => (1, 0.0, text),
        }
    }
}

/// `1234567.89` → `1,234,567.89`.
fn group(s: &str) -> String {
    let (sign, rest) = s.strip_prefix('-').map_or(("", s), |r| ("-", r));
    let (int, frac) = rest
        .split_once('.')
        .map_or((rest, None), |(a, b)| (a, Some(b)));
    let mut out = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    match frac {
        Some(f) => format!("{sign}{out}.{f}"),
        None => format!("{sign}{out}"),
    }
}

/// A table.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// Its id on the page, and the `table=` of its CSV export.
    pub id: &'static str,
    /// The columns.
    pub columns: Vec<Column>,
    /// The rows.
    pub rows: Vec<Vec<Cell>>,
    /// A totals row (not in the CSV: the CSV has one row per group).
    pub footer: Option<Vec<Cell>>,
    /// The link to its CSV export.
    pub csv_href: Option<String>,
    /// The base of its headers' sort links (`?month=2026-11&`), when it is sortable.
    pub sort_href: Option<String>,
}

impl Table {
    /// Leaves out the CSV-only columns and their cells (what a page shows).
    pub fn drop_csv_only(&mut self) {
        let keep: Vec<bool> = self.columns.iter().map(|c| !c.csv_only).collect();
        if keep.iter().all(|k| *k) {
            return;
        }
        let pick = |cells: &mut Vec<Cell>| {
            let mut k = keep.iter();
            cells.retain(|_| *k.next().unwrap_or(&true));
        };
        self.rows.iter_mut().for_each(pick);
        if let Some(f) = self.footer.as_mut() {
            pick(f);
        }
        self.columns.retain(|c| !c.csv_only);
    }

    /// An empty table with these columns.
    pub fn new(id: &'static str, columns: Vec<Column>) -> Table {
        Table {
            id,
            columns,
            rows: Vec::new(),
            footer: None,
            csv_href: None,
            sort_href: None,
        }
    }

    /// Sorts the rows by the column named `name` (ascending or descending); an unknown name
    /// leaves the order as it is and returns false.
    pub fn sort_by(&mut self, name: &str, descending: bool) -> bool {
        let Some(i) = self.columns.iter().position(|c| c.name == name) else {
            return false;
        };
        self.rows.sort_by(|a, b| {
            let (x, y) = (a[i].sort_key(), b[i].sort_key());
            let o =
                x.0.cmp(&y.0)
                    .then(x.1.total_cmp(&y.1))
                    .then_with(|| x.2.cmp(y.2));
            if descending { o.reverse() } else { o }
        });
        true
    }

    /// The table as RFC 4180 CSV: the columns' names, then one record per row of exact values.
    pub fn to_csv(&self) -> String {
        let mut w = csv::WriterBuilder::new()
            .terminator(csv::Terminator::CRLF)
            .from_writer(Vec::new());
        // Writing to a Vec cannot fail.
        let _ = w.write_record(self.columns.iter().map(|c| c.name));
        for row in &self.rows {
            let _ = w.write_record(row.iter().map(|c| c.csv_value().into_owned()));
        }
        String::from_utf8(w.into_inner().unwrap_or_default()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_has_stable_headers_and_exact_values() {
        let mut t = Table::new(
            "tenants",
            vec![
                Column::text("tenant", "Tenant"),
                Column::number("cost", "Cost"),
            ],
        );
        t.rows.push(vec![
            Cell::text("a,\"b\""),
            Cell::money("1234.50".into(), 123_450),
        ]);
        t.rows.push(vec![Cell::text("c"), Cell::Empty]);
        assert_eq!(
            t.to_csv(),
            "tenant,cost\r\n\"a,\"\"b\"\"\",1234.50\r\nc,\r\n"
        );
        assert_eq!(group("-1234567.891"), "-1,234,567.891");
        assert_eq!(group("123"), "123");
    }

    /// Regression: a tenant named `=HYPERLINK("http://…","click")` was written as the leading
    /// cell of every CSV, where a spreadsheet runs it as a formula.
    #[test]
    fn csv_formula_injection_is_written_as_text() {
        let mut t = Table::new(
            "tenants",
            vec![
                Column::text("tenant", "Tenant"),
                Column::number("cost", "Cost"),
            ],
        );
        for name in [
            "=HYPERLINK(\"http://x\",\"click\")",
            "+1",
            "-1",
            "@SUM(A1)",
            "\tx",
            "\rx",
        ] {
            t.rows
                .push(vec![Cell::text(name), Cell::money("-12.50".into(), -1250)]);
        }
        t.rows.push(vec![Cell::text("team-a"), Cell::Empty]);
        let csv = t.to_csv();
        let mut r = csv::Reader::from_reader(csv.as_bytes());
        let rows: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
        for row in &rows[..6] {
            assert!(row[0].starts_with('\''), "{:?}", &row[0]);
            // A negative amount is a number, not text: it stays as it is.
            assert_eq!(&row[1], "-12.50");
        }
        assert_eq!(&rows[6][0], "team-a");
    }

    #[test]
    fn sorting_puts_empty_cells_first_ascending() {
        let mut t = Table::new("x", vec![Column::number("n", "N")]);
        for v in [Some(2.0), None, Some(10.0)] {
            t.rows.push(vec![v.map_or(Cell::Empty, Cell::hours)]);
        }
        assert!(t.sort_by("n", true));
        let order: Vec<&str> = t.rows.iter().map(|r| r[0].value()).collect();
        assert_eq!(order, ["10", "2", ""]);
        assert!(!t.sort_by("nope", false));
    }
}
