//! Prometheus exposition formats: serve each scraper the format it asks for.
//!
//! gpuledger encodes metrics once, with `prometheus-client`, in OpenMetrics text. Prometheus asks
//! for OpenMetrics in its `Accept` header and gets it as is. Everything else (curl, promtool,
//! older scrapers) gets the classic text format 0.0.4, which [`to_classic`] derives from the
//! OpenMetrics text: the two share sample syntax and label escaping and differ only in family
//! metadata (counter families carry their `_total` suffix, info families become gauges, `# UNIT`
//! and `# EOF` do not exist).

/// Content type of OpenMetrics text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of the classic Prometheus text format.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A text exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// Prometheus text format 0.0.4.
    Classic,
}

impl Format {
    /// The `Content-Type` to answer with.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::Classic => CLASSIC_CONTENT_TYPE,
        }
    }
}

/// Renders `prometheus-client` registries as one exposition in `format`.
pub fn render(registries: &[&prometheus_client::registry::Registry], format: Format) -> String {
    let mut out = String::with_capacity(64 * 1024);
    for r in registries {
        prometheus_client::encoding::text::encode_registry(&mut out, r)
            .expect("writing to a String cannot fail");
    }
    prometheus_client::encoding::text::encode_eof(&mut out)
        .expect("writing to a String cannot fail");
    match format {
        Format::OpenMetrics => out,
        Format::Classic => to_classic(&out),
    }
}

/// Picks the format for an `Accept` header: OpenMetrics when the client lists
/// `application/openmetrics-text` with a non-zero quality, classic otherwise.
pub fn negotiate(accept: Option<&str>) -> Format {
    let wants_openmetrics = accept.is_some_and(|accept| {
        accept.split(',').any(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("");
            let zero_q = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    == Some(0.0)
            });
            media.eq_ignore_ascii_case("application/openmetrics-text") && !zero_q
        })
    });
    if wants_openmetrics {
        Format::OpenMetrics
    } else {
        Format::Classic
    }
}

/// Rewrites OpenMetrics text (as `prometheus-client` writes it: no exemplars, no `_created`
/// samples) into the classic text format.
pub fn to_classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (classic_name, classic_kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
                _ => (name.to_owned(), "untyped"),
            };
            if let Some((help_name, text)) = help.take()
                && help_name == name
            {
                out.push_str(&format!("# HELP {classic_name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {classic_name} {classic_kind}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_gets_openmetrics_and_everyone_else_classic() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(negotiate(Some("*/*")), Format::Classic);
        assert_eq!(
            negotiate(Some("application/openmetrics-text;q=0")),
            Format::Classic
        );
        assert_eq!(negotiate(None), Format::Classic);
    }

    #[test]
    fn family_metadata_is_rewritten() {
        let om = "# HELP x_bytes Bytes sent.\n# TYPE x_bytes counter\n# UNIT x_bytes bytes\nx_bytes_total{a=\"q\\\"\"} 3\n\
                  # HELP y Build.\n# TYPE y info\ny_info{version=\"1\"} 1\n# HELP z Temp.\n# TYPE z gauge\nz 1.5\n# EOF\n";
        assert_eq!(
            to_classic(om),
            "# HELP x_bytes_total Bytes sent.\n# TYPE x_bytes_total counter\nx_bytes_total{a=\"q\\\"\"} 3\n\
             # HELP y_info Build.\n# TYPE y_info gauge\ny_info{version=\"1\"} 1\n# HELP z Temp.\n# TYPE z gauge\nz 1.5\n"
        );
    }
}
