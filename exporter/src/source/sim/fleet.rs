//! The simulated fleet's description (TOML), with a built-in default (`default_fleet.toml`).

use std::collections::BTreeMap;
use std::path::Path;

use gpuledger_schema::mig::{self, GpuModel};
use serde::Deserialize;

/// The built-in fleet.
pub const DEFAULT_FLEET: &str = include_str!("default_fleet.toml");

/// A fleet: nodes of GPUs carved into MIG geometries, and the tenants that use them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fleet {
    /// Seed of every random choice; the same seed gives the same trace.
    pub seed: u64,
    /// Mean lease length in minutes (allocations start and end within lease slots of this length).
    #[serde(default = "default_lease_minutes")]
    pub lease_minutes: u32,
    /// Share of lease slots in which an instance is allocated, 0–1.
    #[serde(default = "default_allocated_share")]
    pub allocated_share: f64,
    /// The nodes.
    pub nodes: Vec<NodeSpec>,
    /// The tenants.
    pub tenants: Vec<TenantSpec>,
}

fn default_lease_minutes() -> u32 {
    120
}

fn default_allocated_share() -> f64 {
    0.8
}

/// A node of identical GPUs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Node name.
    pub name: String,
    /// GPU model key (`H100-80GB`, `H200-141GB`, `A100-40GB`, `A100-80GB`).
    pub model: String,
    /// GPUs in the node.
    pub gpus: u32,
    /// MIG geometries, one list of profiles per GPU, cycled over the GPUs; `[]` is a whole GPU.
    pub geometries: Vec<Vec<String>>,
}

/// A tenant and the kinds of workload it runs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// Tenant name (also the Kubernetes namespace of its pods).
    pub name: String,
    /// Relative share of allocations.
    pub weight: u32,
    /// Relative weights of behaviours.
    pub mix: BTreeMap<Behaviour, u32>,
}

/// How a workload uses its slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Behaviour {
    /// Training: steady high SM and tensor activity; heavy NVLink on whole GPUs. SLO class batch.
    Training,
    /// Online inference: diurnal, bursty load. SLO class latency_critical.
    Inference,
    /// A notebook: holds memory, mostly idle, with short bursts and one-second blips (the
    /// hoarder). SLO class interactive.
    Notebook,
    /// A job that stopped working but still holds the slice: all activity at zero.
    Abandoned,
}

/// A fleet file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The file cannot be read.
    #[error("cannot read fleet file {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TOML is malformed.
    #[error("fleet {origin}: {source}")]
    Parse {
        /// The file, or "built-in".
        origin: String,
        /// The TOML error (with line and column).
        source: toml::de::Error,
    },
    /// A value breaks a rule.
    #[error("fleet {origin}: {message}")]
    Invalid {
        /// The file, or "built-in".
        origin: String,
        /// What is wrong.
        message: String,
    },
}

impl Fleet {
    /// The built-in fleet.
    pub fn builtin() -> Fleet {
        Fleet::parse(DEFAULT_FLEET, "built-in").expect("the built-in fleet is valid")
    }

    /// Reads a fleet file.
    pub fn load(path: &Path) -> Result<Fleet, FleetError> {
        let text = std::fs::read_to_string(path).map_err(|source| FleetError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Fleet::parse(&text, &path.display().to_string())
    }

    /// Parses and checks a fleet description.
    pub fn parse(text: &str, origin: &str) -> Result<Fleet, FleetError> {
        let fleet: Fleet = toml::from_str(text).map_err(|source| FleetError::Parse {
            origin: origin.into(),
            source,
        })?;
        let invalid = |message: String| {
            Err(FleetError::Invalid {
                origin: origin.into(),
                message,
            })
        };
        if fleet.nodes.is_empty() {
            return invalid("nodes: at least one node is required".into());
        }
        if fleet.tenants.is_empty() || fleet.tenants.iter().all(|t| t.weight == 0) {
            return invalid(
                "tenants: at least one tenant with a non-zero weight is required".into(),
            );
        }
        if !(0.0..=1.0).contains(&fleet.allocated_share) {
            return invalid(format!(
                "allocated_share: {} is outside 0–1",
                fleet.allocated_share
            ));
        }
        if fleet.lease_minutes == 0 {
            return invalid("lease_minutes: must be at least 1".into());
        }
        for t in &fleet.tenants {
            if t.weight > 0 && t.mix.values().all(|w| *w == 0) {
                return invalid(format!(
                    "tenants.{}.mix: needs at least one non-zero weight",
                    t.name
                ));
            }
        }
        let mut names = std::collections::HashSet::new();
        for node in &fleet.nodes {
            if !names.insert(&node.name) {
                return invalid(format!("nodes: {:?} appears twice", node.name));
            }
            let Some(model) = mig::model(&node.model) else {
                let known: Vec<&str> = mig::MODELS.iter().map(|m| m.key).collect();
                return invalid(format!(
                    "nodes.{}.model: unknown GPU model {:?} (known: {})",
                    node.name,
                    node.model,
                    known.join(", ")
                ));
            };
            if node.geometries.is_empty() {
                return invalid(format!(
                    "nodes.{}.geometries: at least one geometry is required",
                    node.name
                ));
            }
            for g in &node.geometries {
                let names: Vec<&str> = g.iter().map(String::as_str).collect();
                if let Some(bad) = names.iter().find(|n| model.profile(n).is_none()) {
                    return invalid(format!(
                        "nodes.{}.geometries: {} has no MIG profile {bad:?}",
                        node.name, model.key
                    ));
                }
                if mig::place(model, &names).is_none() {
                    return invalid(format!(
                        "nodes.{}.geometries: {names:?} does not fit on one {} under the MIG placement rules",
                        node.name, model.key
                    ));
                }
            }
        }
        Ok(fleet)
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

impl NodeSpec {
    /// The node's GPU model (checked when the fleet was parsed).
    pub fn gpu_model(&self) -> &'static GpuModel {
        mig::model(&self.model).expect("validated when the fleet was parsed")
    }
}
