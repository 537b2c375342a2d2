//! A static map file: device UUID (or GPU + instance id) → tenant, workload, SLO class.
//!
//! ```toml
//! [[device]]
//! uuid = "MIG-5c0f…"          # a MIG device or a whole GPU (GPU-…)
//! tenant = "search"
//! workload = "search/ranker-0"  # optional
//! slo_class = "latency_critical" # optional
//!
//! [[device]]
//! gpu_uuid = "GPU-1d2e…"        # or: the parent GPU and the GPU instance id
//! gpu_instance_id = 3
//! tenant = "research"
//! ```
//!
//! A mapped instance takes the map's attribution; an unmapped one keeps what the source said
//! (nothing, for NVML).

use std::collections::HashMap;
use std::path::Path;

use gpuledger_schema::{Attribution, SloClass};
use serde::Deserialize;

use crate::source::Reading;

use super::Attributor;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MapFile {
    #[serde(default)]
    device: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    uuid: Option<String>,
    gpu_uuid: Option<String>,
    gpu_instance_id: Option<u32>,
    tenant: String,
    workload: Option<String>,
    slo_class: Option<SloClass>,
}

/// A static device → tenant map.
#[derive(Debug, Clone, Default)]
pub struct StaticMap {
    by_uuid: HashMap<String, Attribution>,
    by_instance: HashMap<(String, u32), Attribution>,
}

/// A map file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// Unreadable.
    #[error("cannot read attribution map {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Malformed TOML or a wrong field.
    #[error("attribution map {path}: {message}")]
    Invalid {
        /// The path.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl StaticMap {
    /// Reads a map file.
    pub fn load(path: &Path) -> Result<StaticMap, MapError> {
        let text = std::fs::read_to_string(path).map_err(|source| MapError::Read {
            path: path.display().to_string(),
            source,
        })?;
        StaticMap::parse(&text).map_err(|message| MapError::Invalid {
            path: path.display().to_string(),
            message,
        })
    }

    /// Parses a map.
    pub fn parse(text: &str) -> Result<StaticMap, String> {
        let file: MapFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut map = StaticMap::default();
        for (i, e) in file.device.into_iter().enumerate() {
            if e.tenant.is_empty() {
                return Err(format!("device[{i}].tenant: must not be empty"));
            }
            let attribution = Attribution {
                tenant: Some(e.tenant),
                workload: e.workload,
                slo_class: e.slo_class,
                owner: None,
                owner_ref: None,
            };
            match (e.uuid, e.gpu_uuid, e.gpu_instance_id) {
                (Some(uuid), None, None) => {
                    map.by_uuid.insert(uuid, attribution);
                }
                (None, Some(gpu), Some(gi)) => {
                    map.by_instance.insert((gpu, gi), attribution);
                }
                _ => {
                    return Err(format!(
                        "device[{i}]: give either uuid, or gpu_uuid with gpu_instance_id"
                    ));
                }
            }
        }
        Ok(map)
    }

    /// Sets the attribution of every mapped reading.
    pub fn apply_to(&self, readings: &mut [Reading]) {
        for r in readings {
            let found = r
                .mig_uuid
                .as_ref()
                .and_then(|u| self.by_uuid.get(u))
                .or_else(|| {
                    r.instance
                        .gpu_instance_id
                        .and_then(|gi| self.by_instance.get(&(r.instance.gpu_uuid.clone(), gi)))
                })
                .or_else(|| {
                    r.instance
                        .mig_profile
                        .is_none()
                        .then(|| self.by_uuid.get(&r.instance.gpu_uuid))
                        .flatten()
                });
            if let Some(a) = found {
                r.attribution = a.clone();
            }
        }
    }
}

impl Attributor for StaticMap {
    fn name(&self) -> &'static str {
        "static"
    }

    fn collector(&self) -> &'static str {
        "attribution_static"
    }

    fn refresh(&mut self) -> Result<(), String> {
        Ok(())
    }

    fn apply(&self, readings: &mut [Reading]) {
        self.apply_to(readings);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_schema::{Counters, Instance};

    fn reading(gpu: &str, gi: Option<u32>, mig_uuid: Option<&str>) -> Reading {
        Reading {
            instance: Instance {
                node: "n".into(),
                gpu_uuid: gpu.into(),
                gpu_model: "m".into(),
                mig_profile: gi.map(|_| "1g.10gb".into()),
                gpu_instance_id: gi,
                placement_start: None,
                placement_size: None,
            },
            mig_uuid: mig_uuid.map(Into::into),
            gpu_index: None,
            attribution: Attribution::default(),
            counters: Counters::default(),
        }
    }

    #[test]
    fn maps_by_mig_uuid_gpu_uuid_or_instance() {
        let map = StaticMap::parse(
            r#"
            [[device]]
            uuid = "MIG-1"
            tenant = "a"
            slo_class = "interactive"
            [[device]]
            uuid = "GPU-2"
            tenant = "b"
            workload = "b/train"
            [[device]]
            gpu_uuid = "GPU-3"
            gpu_instance_id = 7
            tenant = "c"
            "#,
        )
        .unwrap();
        let mut rs = vec![
            reading("GPU-1", Some(9), Some("MIG-1")),
            reading("GPU-2", None, None),
            reading("GPU-3", Some(7), Some("MIG-x")),
            reading("GPU-3", Some(8), Some("MIG-y")),
        ];
        map.apply_to(&mut rs);
        let tenants: Vec<Option<&str>> =
            rs.iter().map(|r| r.attribution.tenant.as_deref()).collect();
        assert_eq!(tenants, [Some("a"), Some("b"), Some("c"), None]);
        assert_eq!(rs[0].attribution.slo_class, Some(SloClass::Interactive));
    }

    #[test]
    fn bad_maps_say_which_entry() {
        let err = StaticMap::parse("[[device]]\ntenant = \"a\"\n").unwrap_err();
        assert!(err.starts_with("device[0]:"), "{err}");
        assert!(
            StaticMap::parse("[[device]]\nuuid = \"x\"\ntenant = \"a\"\nslo_class = \"gold\"\n")
                .is_err()
        );
    }
}
