//! Bar charts drawn on the server as inline SVG: the geometry is computed here, the template
//! only places the shapes (escaped like any other value). No JavaScript; readable in print (the
//! series differ by fill pattern as well as colour, and the table beside the chart has the
//! numbers).

/// One series: a name for the legend, a CSS class for its colour, a value per category.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// `s0`, `s1`, … (the stylesheet's colours).
    pub class: &'static str,
    /// One value per category.
    pub values: Vec<f64>,
}

/// A bar, placed.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// Left edge.
    pub x: f64,
    /// Top edge.
    pub y: f64,
    /// Width.
    pub w: f64,
    /// Height.
    pub h: f64,
    /// Its series' class.
    pub class: &'static str,
    /// Tooltip: category, series and value.
    pub title: String,
}

/// A label on an axis.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    /// Position along the axis.
    pub at: f64,
    /// Text.
    pub label: String,
}

/// A grouped bar chart, laid out.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// What it shows (the SVG's `<title>`).
    pub title: String,
    /// The unit of the values, for the axis.
    pub unit: String,
    /// Viewbox width.
    pub width: f64,
    /// Viewbox height.
    pub height: f64,
    /// The plot area's left, top, right and bottom edges.
    pub left: f64,
    /// Top edge of the plot area.
    pub top: f64,
    /// Right edge of the plot area.
    pub right: f64,
    /// Bottom edge of the plot area (the zero line).
    pub bottom: f64,
    /// The bars.
    pub bars: Vec<Bar>,
    /// Category labels along x.
    pub x_ticks: Vec<Tick>,
    /// Value labels along y.
    pub y_ticks: Vec<Tick>,
    /// (class, name) per series.
    pub legend: Vec<(&'static str, String)>,
    /// A horizontal reference line (a budget): its height and its label.
    pub rule: Option<Tick>,
}

/// A "nice" upper bound for an axis: 1, 2 or 5 × 10ⁿ at or above `max`.
fn nice(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|v| *v >= max)
        .unwrap_or(10.0 * p)
}

fn short(v: f64) -> String {
    match v.abs() {
        a if a >= 1e6 => format!("{:.1}M", v / 1e6),
        a if a >= 1e3 => format!("{:.1}k", v / 1e3),
        a if a >= 10.0 || a == 0.0 => format!("{v:.0}"),
        _ => format!("{v:.1}"),
    }
}

impl Chart {
    /// Bars for each category, one per series side by side. `categories` label the x axis
    /// (every label is kept; the template thins them when there are many).
    pub fn grouped(
        title: impl Into<String>,
        unit: impl Into<String>,
        categories: &[String],
        series: &[Series],
    ) -> Chart {
        Chart::build(title, unit, categories, series, 0.0)
    }

    /// [`Chart::grouped`] with an axis that reaches at least `at_least`.
    fn build(
        title: impl Into<String>,
        unit: impl Into<String>,
        categories: &[String],
        series: &[Series],
        at_least: f64,
    ) -> Chart {
        let (width, height) = (960.0, 280.0);
        let (left, top, right, bottom) = (64.0, 16.0, width - 12.0, height - 40.0);
        let max = series
            .iter()
            .flat_map(|s| s.values.iter().copied())
            .fold(at_least, f64::max);
        let top_value = nice(max);
        let unit = unit.into();
        let n = categories.len().max(1) as f64;
        let slot = (right - left) / n;
        let k = series.len().max(1) as f64;
        let bar_w = (slot * 0.8 / k).max(0.5);
        let scale = (bottom - top) / top_value;
        let mut bars = Vec::new();
        for (ci, cat) in categories.iter().enumerate() {
            for (si, s) in series.iter().enumerate() {
                let v = s.values.get(ci).copied().unwrap_or(0.0).max(0.0);
                let h = v * scale;
                bars.push(Bar {
                    x: left + slot * ci as f64 + slot * 0.1 + bar_w * si as f64,
                    y: bottom - h,
                    w: bar_w,
                    h,
                    class: s.class,
                    title: format!("{cat}: {} {} {unit}", s.name, short(v)),
                });
            }
        }
        // At most 12 labels: a month of dates side by side would overlap.
        let every = categories.len().div_ceil(12).max(1);
        let x_ticks = categories
            .iter()
            .enumerate()
            .filter(|(i, _)| i % every == 0)
            .map(|(i, c)| Tick {
                at: left + slot * (i as f64 + 0.5),
                label: c.clone(),
            })
            .collect();
        let y_ticks = (0..=4)
            .map(|i| {
                let v = top_value * f64::from(i) / 4.0;
                Tick {
                    at: bottom - v * scale,
                    label: short(v),
                }
            })
            .collect();
        Chart {
            title: title.into(),
            unit,
            width,
            height,
            left,
            top,
            right,
            bottom,
            bars,
            x_ticks,
            y_ticks,
            legend: series.iter().map(|s| (s.class, s.name.clone())).collect(),
            rule: None,
        }
    }

    /// The same bars under a horizontal line at `value` labelled `label` (a budget); the axis
    /// grows to hold the line.
    pub fn with_rule(
        title: impl Into<String>,
        unit: impl Into<String>,
        categories: &[String],
        series: &[Series],
        value: f64,
        label: impl Into<String>,
    ) -> Chart {
        let mut c = Chart::build(title, unit, categories, series, value.max(0.0));
        let top_value = nice(
            series
                .iter()
                .flat_map(|s| s.values.iter().copied())
                .fold(value.max(0.0), f64::max),
        );
        c.rule = Some(Tick {
            at: c.bottom - value.max(0.0) * (c.bottom - c.top) / top_value,
            label: label.into(),
        });
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_a_nice_axis() {
        assert_eq!(nice(73.0), 100.0);
        assert_eq!(nice(101.0), 200.0);
        assert_eq!(nice(0.3), 0.5);
        let c = Chart::grouped(
            "t",
            "GPU-hours",
            &["d1".into(), "d2".into()],
            &[
                Series {
                    name: "allocated".into(),
                    class: "s0",
                    values: vec![100.0, 50.0],
                },
                Series {
                    name: "used".into(),
                    class: "s1",
                    values: vec![25.0, 0.0],
                },
            ],
        );
        assert_eq!(c.bars.len(), 4);
        // 100 fills the plot; 25 is a quarter of it; every bar stands on the zero line.
        assert!((c.bars[0].h - (c.bottom - c.top)).abs() < 1e-9);
        assert!((c.bars[1].h * 4.0 - c.bars[0].h).abs() < 1e-9);
        assert!(c.bars.iter().all(|b| (b.y + b.h - c.bottom).abs() < 1e-9));
        assert_eq!(c.y_ticks.last().unwrap().label, "100");

        // A budget line above every bar raises the axis to hold it, and sits at its value.
        let r = Chart::with_rule(
            "t",
            "USD",
            &["d1".into()],
            &[Series {
                name: "spent".into(),
                class: "s0",
                values: vec![40.0],
            }],
            150.0,
            "budget 150",
        );
        assert_eq!(r.y_ticks.last().unwrap().label, "200");
        let rule = r.rule.unwrap();
        assert!((rule.at - (r.bottom - 0.75 * (r.bottom - r.top))).abs() < 1e-9);
        assert!((r.bars[0].h - 0.2 * (r.bottom - r.top)).abs() < 1e-9);
    }
}
