//! The price book: what one GPU-hour of each model costs, an optional price per instance-hour of
//! a MIG profile, each with the instant it takes effect. Definitions: `schema/ANALYTICS.md`
//! ("Money: the price book and the bill (`GET /api/v1/bill`, the Tenants page)").
//!
//! Key decision: a price is looked up per piece of the range, never per range. Showback cuts the
//! range at every instant a price takes effect ([`PriceBook::changes_within`]), so a price change
//! mid-month splits the bill exactly at that instant and each side is charged its own price.

use gpuledger_schema::mig;

/// One entry of the book.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Price {
    /// The GPU model (its key such as `H100-80GB`, or the NVML name).
    pub gpu_model: String,
    /// A MIG profile (`1g.10gb`): this entry prices one instance-hour of that profile on that
    /// model. `None`: one GPU-hour of the model (whole GPUs, and MIG profiles without their own).
    pub mig_profile: Option<String>,
    /// The price of one hour: a GPU-hour, or an instance-hour of `mig_profile`.
    pub per_hour: f64,
    /// When it takes effect (Unix seconds); `None`: since always.
    pub from: Option<i64>,
}

/// The prices in force.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PriceBook {
    /// The currency of every price (shown, never converted).
    pub currency: String,
    /// Price of a GPU-hour of a model the book does not name.
    pub default_per_gpu_hour: f64,
    /// The entries, in the order configured.
    pub entries: Vec<Price>,
}

impl Default for PriceBook {
    fn default() -> Self {
        PriceBook {
            currency: "USD".into(),
            default_per_gpu_hour: 0.0,
            entries: Vec::new(),
        }
    }
}

/// Whether `entry` names `model` (by the name the exporter reported, or the model's key or NVML
/// name).
fn names_model(entry: &str, model: &str) -> bool {
    entry == model || mig::model(model).is_some_and(|m| entry == m.key || entry == m.nvml_name)
}

impl PriceBook {
    /// The entry in force at `at` for `model` and `profile`: the latest-effective one, a
    /// profile's own entry before the model's.
    fn entry(&self, model: &str, profile: Option<&str>, at: i64) -> Option<&Price> {
        let latest = |want: Option<&str>| {
            self.entries
                .iter()
                .filter(|e| e.mig_profile.as_deref() == want && names_model(&e.gpu_model, model))
                .filter(|e| e.from.is_none_or(|f| f <= at))
                .max_by_key(|e| e.from.unwrap_or(i64::MIN))
        };
        profile
            .and_then(|p| latest(Some(p)))
            .or_else(|| latest(None))
    }

    /// The price of one GPU-second (one whole GPU's worth of capacity) of an instance of
    /// `profile` on `model` at `at`. A profile priced per instance-hour is turned into GPU-seconds
    /// through its size (a `1g.10gb` is 1/7 of a GPU).
    pub fn per_gpu_second(&self, model: &str, profile: Option<&str>, at: i64) -> f64 {
        match self.entry(model, profile, at) {
            Some(e) if e.mig_profile.is_some() => {
                let size = mig::gpu_equivalents_of(e.mig_profile.as_deref()).unwrap_or(1.0);
                e.per_hour / 3600.0 / size
            }
            Some(e) => e.per_hour / 3600.0,
            None => self.default_per_gpu_hour / 3600.0,
        }
    }

    /// Whether any entry prices a MIG profile (showback then needs each allocation's profile).
    pub fn has_profile_prices(&self) -> bool {
        self.entries.iter().any(|e| e.mig_profile.is_some())
    }

    /// The instants strictly inside `(from, to)` at which some price takes effect, ascending.
    pub fn changes_within(&self, from: i64, to: i64) -> Vec<i64> {
        let mut out: Vec<i64> = self
            .entries
            .iter()
            .filter_map(|e| e.from)
            .filter(|&f| from < f && f < to)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// `[from, to)` cut at every price change inside it.
    pub fn periods(&self, from: i64, to: i64) -> Vec<(i64, i64)> {
        let mut edges = vec![from];
        edges.extend(self.changes_within(from, to));
        edges.push(to);
        edges.windows(2).map(|w| (w[0], w[1])).collect()
    }

    /// The entries in force at some instant of `[from, to)`, each with the part of the range it
    /// was in force for (the Prices page).
    pub fn in_force(&self, from: i64, to: i64) -> Vec<PriceInForce> {
        let mut out = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            // It is superseded at the next entry for the same model and profile.
            let until = self
                .entries
                .iter()
                .filter(|o| {
                    o.mig_profile == e.mig_profile
                        && names_model(&o.gpu_model, &e.gpu_model)
                        && o.from.unwrap_or(i64::MIN) > e.from.unwrap_or(i64::MIN)
                })
                .filter_map(|o| o.from)
                .min();
            let start = e.from.unwrap_or(i64::MIN).max(from);
            let end = until.unwrap_or(i64::MAX).min(to);
            if start < end {
                out.push(PriceInForce {
                    gpu_model: e.gpu_model.clone(),
                    mig_profile: e.mig_profile.clone(),
                    per_hour: e.per_hour,
                    per_gpu_hour: self.per_gpu_second(
                        &e.gpu_model,
                        e.mig_profile.as_deref(),
                        start,
                    ) * 3600.0,
                    from: start,
                    to: end,
                    order: i,
                });
            }
        }
        out.sort_by(|a, b| {
            (&a.gpu_model, &a.mig_profile, a.from).cmp(&(&b.gpu_model, &b.mig_profile, b.from))
        });
        out
    }
}

/// One price and the part of a range it was in force for.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PriceInForce {
    /// The model.
    pub gpu_model: String,
    /// The profile, for a per-instance price.
    pub mig_profile: Option<String>,
    /// The price as configured (per GPU-hour, or per instance-hour of the profile).
    pub per_hour: f64,
    /// The same per GPU-hour of capacity.
    pub per_gpu_hour: f64,
    /// In force from (within the range).
    pub from: i64,
    /// Until (within the range).
    pub to: i64,
    /// Its place in the configuration.
    #[serde(skip)]
    pub order: usize,
}

/// One `[[price_book]]` entry of the aggregator's config file.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceFile {
    /// The GPU model: its key (`H100-80GB`) or NVML name.
    pub gpu_model: String,
    /// Price of one GPU-hour of the model (an entry without `mig_profile`).
    pub per_gpu_hour: Option<f64>,
    /// A MIG profile, priced per instance-hour.
    pub mig_profile: Option<String>,
    /// Price of one instance-hour of `mig_profile`.
    pub per_instance_hour: Option<f64>,
    /// When it takes effect: `YYYY-MM-DD` (UTC midnight) or RFC 3339.
    pub from: Option<String>,
}

/// A price book entry that cannot be used; the message names the key.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct PriceError {
    /// The key at fault, as written in the file (`price_book[2].from`).
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

fn effective(key: &str, s: &str) -> Result<i64, PriceError> {
    let day = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc().timestamp());
    day.or_else(|| {
        chrono::DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|t| t.timestamp())
    })
    .ok_or_else(|| PriceError {
        key: key.into(),
        problem: format!("{s:?} is not a date (YYYY-MM-DD) or an RFC 3339 time"),
    })
}

impl PriceBook {
    /// Builds the book from the config file: the `[prices]` table (model → price per GPU-hour,
    /// since always), the `[[price_book]]` entries, the default price and the currency.
    pub fn from_config(
        prices: &std::collections::HashMap<String, f64>,
        entries: &[PriceFile],
        default_per_gpu_hour: f64,
        currency: String,
    ) -> Result<PriceBook, PriceError> {
        let price = |key: String, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(v)
            } else {
                Err(PriceError {
                    key,
                    problem: format!("{v} is not a price"),
                })
            }
        };
        let mut book = PriceBook {
            currency,
            default_per_gpu_hour: price("default_price".into(), default_per_gpu_hour)?,
            entries: Vec::new(),
        };
        let mut legacy: Vec<_> = prices.iter().collect();
        legacy.sort_by(|a, b| a.0.cmp(b.0));
        for (model, &v) in legacy {
            book.entries.push(Price {
                gpu_model: model.clone(),
                mig_profile: None,
                per_hour: price(format!("prices.{model:?}"), v)?,
                from: None,
            });
        }
        for (i, e) in entries.iter().enumerate() {
            let key = |k: &str| format!("price_book[{i}].{k}");
            let per_hour = match (&e.mig_profile, e.per_gpu_hour, e.per_instance_hour) {
                (None, Some(p), None) => price(key("per_gpu_hour"), p)?,
                (Some(profile), None, Some(p)) => {
                    let known = mig::model(&e.gpu_model).ok_or_else(|| PriceError {
                        key: key("gpu_model"),
                        problem: format!(
                            "{:?} is not a GPU model gpuledger knows the MIG profiles of",
                            e.gpu_model
                        ),
                    })?;
                    if known.profile(profile).is_none() {
                        return Err(PriceError {
                            key: key("mig_profile"),
                            problem: format!("{} has no MIG profile {profile:?}", known.key),
                        });
                    }
                    price(key("per_instance_hour"), p)?
                }
                (None, _, _) => {
                    return Err(PriceError {
                        key: key("per_gpu_hour"),
                        problem: "an entry without mig_profile takes per_gpu_hour (and no per_instance_hour)".into(),
                    });
                }
                (Some(_), _, _) => {
                    return Err(PriceError {
                        key: key("per_instance_hour"),
                        problem: "an entry with mig_profile takes per_instance_hour (and no per_gpu_hour)".into(),
                    });
                }
            };
            let from = e
                .from
                .as_deref()
                .map(|s| effective(&key("from"), s))
                .transpose()?;
            let clash = book.entries.iter().any(|o| {
                o.from == from
                    && o.mig_profile == e.mig_profile
                    && names_model(&o.gpu_model, &e.gpu_model)
            });
            if clash {
                return Err(PriceError {
                    key: key("from"),
                    problem: format!(
                        "{} {} already has a price from that instant",
                        e.gpu_model,
                        e.mig_profile.as_deref().unwrap_or("")
                    ),
                });
            }
            book.entries.push(Price {
                gpu_model: e.gpu_model.clone(),
                mig_profile: e.mig_profile.clone(),
                per_hour,
                from,
            });
        }
        Ok(book)
    }
}

/// What a tenant is charged for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostMode {
    /// What it held (the default): an allocated, idle GPU costs as much as a busy one.
    #[default]
    Allocation,
    /// What it used (SM activity × size); its idle becomes overhead.
    Usage,
}

/// Where the overhead goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleSharing {
    /// A line of its own, the platform's (the default).
    #[default]
    Overhead,
    /// Shared out to the tenants in proportion to their charges.
    Share,
}

impl CostMode {
    /// The name the API and the pages use.
    pub fn as_str(self) -> &'static str {
        match self {
            CostMode::Allocation => "allocation",
            CostMode::Usage => "usage",
        }
    }
}

impl IdleSharing {
    /// The name the API and the pages use.
    pub fn as_str(self) -> &'static str {
        match self {
            IdleSharing::Overhead => "overhead",
            IdleSharing::Share => "share",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book() -> PriceBook {
        PriceBook {
            currency: "EUR".into(),
            default_per_gpu_hour: 1.0,
            entries: vec![
                Price {
                    gpu_model: "H100-80GB".into(),
                    mig_profile: None,
                    per_hour: 3.6,
                    from: None,
                },
                Price {
                    gpu_model: "H100-80GB".into(),
                    mig_profile: None,
                    per_hour: 7.2,
                    from: Some(1_000),
                },
                Price {
                    gpu_model: "NVIDIA H100 80GB HBM3".into(),
                    mig_profile: Some("1g.10gb".into()),
                    per_hour: 0.72,
                    from: None,
                },
            ],
        }
    }

    #[test]
    fn the_latest_entry_in_force_prices_each_instant() {
        let b = book();
        let h100 = "NVIDIA H100 80GB HBM3";
        assert_eq!(b.per_gpu_second(h100, None, 999), 3.6 / 3600.0);
        assert_eq!(b.per_gpu_second(h100, None, 1_000), 7.2 / 3600.0);
        assert_eq!(
            b.per_gpu_second("H100-80GB", Some("3g.40gb"), 5),
            3.6 / 3600.0
        );
        // 0.72 per instance-hour of a 1/7 GPU is 5.04 per GPU-hour.
        let p = b.per_gpu_second(h100, Some("1g.10gb"), 5_000) * 3600.0;
        assert!((p - 5.04).abs() < 1e-9, "{p}");
        assert_eq!(
            b.per_gpu_second(h100, Some("1g.10gb"), 5_000),
            b.per_gpu_second("H100-80GB", Some("1g.10gb"), 0)
        );
        assert_eq!(b.per_gpu_second("A100-unknown", None, 0), 1.0 / 3600.0);
    }

    #[test]
    fn a_change_mid_range_splits_it() {
        let b = book();
        assert_eq!(b.periods(0, 2_000), [(0, 1_000), (1_000, 2_000)]);
        assert_eq!(b.periods(1_000, 2_000), [(1_000, 2_000)]);
        let f = b.in_force(0, 2_000);
        let model: Vec<_> = f
            .iter()
            .filter(|p| p.mig_profile.is_none())
            .map(|p| (p.per_hour, p.from, p.to))
            .collect();
        assert_eq!(model, [(3.6, 0, 1_000), (7.2, 1_000, 2_000)]);
    }
}

#[cfg(test)]
mod config_tests {
    use super::*;

    fn entry(toml_text: &str) -> Result<PriceBook, PriceError> {
        #[derive(serde::Deserialize)]
        struct F {
            price_book: Vec<PriceFile>,
        }
        let f: F = toml::from_str(toml_text).unwrap();
        PriceBook::from_config(&Default::default(), &f.price_book, 0.0, "USD".into())
    }

    #[test]
    fn errors_name_the_entry_and_key() {
        let e = entry("[[price_book]]\ngpu_model = \"H100-80GB\"\nper_gpu_hour = 2.0\n[[price_book]]\ngpu_model = \"H100-80GB\"\nper_gpu_hour = 2.5\nfrom = \"Nov 1\"").unwrap_err();
        assert_eq!(e.key, "price_book[1].from");
        let e = entry("[[price_book]]\ngpu_model = \"H100-80GB\"\nmig_profile = \"9g.1gb\"\nper_instance_hour = 2.0").unwrap_err();
        assert_eq!(e.key, "price_book[0].mig_profile");
        let e =
            entry("[[price_book]]\ngpu_model = \"H100-80GB\"\nper_gpu_hour = -1.0").unwrap_err();
        assert_eq!(e.key, "price_book[0].per_gpu_hour");
        let e = entry("[[price_book]]\ngpu_model = \"H100-80GB\"\nper_gpu_hour = 2.0\n[[price_book]]\ngpu_model = \"NVIDIA H100 80GB HBM3\"\nper_gpu_hour = 3.0").unwrap_err();
        assert_eq!(e.key, "price_book[1].from", "{e}");
        let b = entry("[[price_book]]\ngpu_model = \"H100-80GB\"\nper_gpu_hour = 2.0\n[[price_book]]\ngpu_model = \"H100-80GB\"\nper_gpu_hour = 3.0\nfrom = \"2026-11-15\"").unwrap();
        assert_eq!(b.entries[1].from, Some(1_794_700_800));
    }
}
