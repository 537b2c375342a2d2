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

/// The kind of a metric family, from its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A monotonic total; its one sample is `<family>_total`.
    Counter,
    /// A value that goes up and down; its sample has the family's name.
    Gauge,
    /// Cumulative buckets: `<family>_bucket{le}`, `<family>_sum`, `<family>_count`.
    Histogram,
    /// Constant labels; its sample is `<family>_info`, always 1.
    Info,
    /// Any other OpenMetrics type (summary, stateset, gaugehistogram, unknown); gpuledger writes
    /// none, and readers may skip them.
    Other,
}

/// One sample line of a family.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's full name (`x_total`, `x_bucket`, `x`).
    pub name: String,
    /// Label pairs in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

/// One metric family of an OpenMetrics exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// The family name (without `_total`, `_bucket`, …).
    pub name: String,
    /// Its type.
    pub kind: Kind,
    /// Its `# UNIT`, when it has one (`bytes`, `seconds`, `ratios`, …).
    pub unit: Option<String>,
    /// Its `# HELP` text, unescaped.
    pub help: String,
    /// Its samples; a family with no series yet has none.
    pub samples: Vec<Sample>,
}

/// A line of an exposition that [`parse`] cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("exposition line {line}: {reason}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

/// Reads OpenMetrics text as `prometheus-client` writes it (what [`render`] returns for
/// [`Format::OpenMetrics`]) into its families, in order. Used to forward the same numbers over
/// OTLP, so that `/metrics` and a push cannot disagree. Samples before any `# TYPE` line, or whose
/// name does not belong to the current family, are errors: a reader that guessed would mislabel.
pub fn parse(openmetrics: &str) -> Result<Vec<Family>, ParseError> {
    let mut families: Vec<Family> = Vec::new();
    let mut help: Option<(String, String)> = None;
    for (i, line) in openmetrics.lines().enumerate() {
        let err = |reason: String| ParseError {
            line: i + 1,
            reason,
        };
        if line.is_empty() || line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let (keyword, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            match keyword {
                "HELP" => help = Some((name.to_owned(), unescape(text))),
                "TYPE" => {
                    let kind = match text {
                        "counter" => Kind::Counter,
                        "gauge" => Kind::Gauge,
                        "histogram" => Kind::Histogram,
                        "info" => Kind::Info,
                        _ => Kind::Other,
                    };
                    let help = match help.take() {
                        Some((n, h)) if n == name => h,
                        _ => String::new(),
                    };
                    families.push(Family {
                        name: name.to_owned(),
                        kind,
                        unit: None,
                        help,
                        samples: Vec::new(),
                    });
                }
                "UNIT" => match families.last_mut() {
                    Some(f) if f.name == name => f.unit = Some(text.to_owned()),
                    _ => return Err(err(format!("UNIT for {name:?} outside its family"))),
                },
                _ => {}
            }
            continue;
        }
        let family = families
            .last_mut()
            .ok_or_else(|| err("a sample before any # TYPE line".into()))?;
        let sample = parse_sample(line).map_err(err)?;
        let suffix = sample
            .name
            .strip_prefix(family.name.as_str())
            .unwrap_or("?");
        let belongs = match family.kind {
            Kind::Counter => matches!(suffix, "_total" | "_created"),
            Kind::Gauge => suffix.is_empty(),
            Kind::Histogram => matches!(suffix, "_bucket" | "_sum" | "_count" | "_created"),
            Kind::Info => suffix == "_info",
            Kind::Other => true,
        };
        if !belongs {
            return Err(err(format!(
                "sample {:?} does not belong to the family {:?}",
                sample.name, family.name
            )));
        }
        family.samples.push(sample);
    }
    Ok(families)
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or_else(|| format!("no value in {line:?}"))?;
    let name = line[..name_end].to_owned();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(body) = rest.strip_prefix('{') {
        rest = body;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find("=\"").ok_or("a label without =\"")?;
            let key = rest[..eq].trim_start_matches(',').to_owned();
            let mut value = String::new();
            let mut chars = rest[eq + 2..].char_indices();
            let end = loop {
                match chars.next() {
                    None => return Err(format!("an unterminated value of label {key:?}")),
                    Some((j, '"')) => break eq + 2 + j + 1,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c)) => value.push(c),
                        None => return Err(format!("an unterminated value of label {key:?}")),
                    },
                    Some((_, c)) => value.push(c),
                }
            };
            labels.push((key, value));
            rest = &rest[end..];
        }
    }
    let value = rest.split_whitespace().next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse()
            .map_err(|_| format!("value {v:?} is not a number"))?,
    };
    Ok(Sample {
        name,
        labels,
        value,
    })
}

fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
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
    #[test]
    fn parse_reads_every_family_kind_with_escaped_labels() {
        let om = "# HELP x_bytes Bytes \\\\ sent.\n# TYPE x_bytes counter\n# UNIT x_bytes bytes\nx_bytes_total{a=\"q\\\"\",b=\"l\\nm\"} 3\n\
                  # HELP y Build.\n# TYPE y info\ny_info{version=\"1\"} 1\n# HELP z Temp.\n# TYPE z gauge\nz 1.5\n\
                  # HELP h Commit.\n# TYPE h histogram\nh_sum 2.5\nh_count 2\nh_bucket{le=\"1.0\"} 1\nh_bucket{le=\"+Inf\"} 2\n\
                  # HELP e Empty.\n# TYPE e gauge\n# EOF\n";
        let f = parse(om).unwrap();
        let names: Vec<_> = f.iter().map(|f| (f.name.as_str(), f.kind)).collect();
        assert_eq!(
            names,
            [
                ("x_bytes", Kind::Counter),
                ("y", Kind::Info),
                ("z", Kind::Gauge),
                ("h", Kind::Histogram),
                ("e", Kind::Gauge)
            ]
        );
        assert_eq!(f[0].help, "Bytes \\ sent.");
        assert_eq!(f[0].unit.as_deref(), Some("bytes"));
        assert_eq!(
            f[0].samples[0].labels,
            [("a".into(), "q\"".into()), ("b".into(), "l\nm".into())]
        );
        assert_eq!(f[0].samples[0].value, 3.0);
        assert_eq!(f[2].samples[0].labels, []);
        assert_eq!(f[3].samples[3].value, 2.0);
        assert_eq!(f[3].samples[3].labels[0].1, "+Inf");
        assert!(f[4].samples.is_empty());
    }

    #[test]
    fn parse_refuses_a_sample_of_another_family() {
        let err = parse("# TYPE z gauge\nzz 1\n").unwrap_err();
        assert_eq!(err.line, 2, "{err}");
        assert!(parse("z 1\n").is_err());
        assert!(parse("# TYPE z gauge\nz{a=\"1} 1\n").is_err());
    }

    #[test]
    fn parse_reads_what_render_writes() {
        use prometheus_client::metrics::{counter::Counter, family::Family as F, gauge::Gauge};
        let mut r = prometheus_client::registry::Registry::default();
        let c: F<Vec<(String, String)>, Counter> = F::default();
        c.get_or_create(&vec![("tenant".into(), "a\"b".into())])
            .inc_by(7);
        r.register_with_unit("sent", "Sent.", prometheus_client::registry::Unit::Bytes, c);
        let g = Gauge::<i64>::default();
        g.set(-4);
        r.register("level", "Level.", g);
        let f = parse(&render(&[&r], Format::OpenMetrics)).unwrap();
        assert_eq!(f[0].name, "sent_bytes");
        assert_eq!(f[0].samples[0].name, "sent_bytes_total");
        assert_eq!(f[0].samples[0].labels[0].1, "a\"b");
        assert_eq!(f[1].samples[0].value, -4.0);
    }
}
