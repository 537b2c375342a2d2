//! `GET /api/v1/fragmentation?at=` (or `?from=&to=`): per GPU free slots, the largest placeable
//! profile and stranded capacity, per-node and fleet totals, and re-geometry advice. Fleet data:
//! not for `tenant:` tokens. Definitions: `schema/ANALYTICS.md`.

use std::collections::{BTreeMap, HashMap};

use axum::Json;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use gpuledger_schema::mig::SLICES_PER_GPU;
use serde_json::{Value, json};

use super::error::ApiError;
use super::showback::only_params;
use super::{AppState, range_params, time_param};
use crate::analytics::{self, fragmentation, price_per_gpu_second};

/// How far back `at` looks for a GPU's latest observed second.
const MAX_AGE_SECS: i64 = 120;

/// The handler.
pub async fn fragmentation(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let role = app.tokens.authenticate(&headers)?;
    if role.read_scope()?.is_some() {
        return Err(ApiError::forbidden(
            "authorization",
            "fragmentation is fleet data; a tenant: token cannot read it",
        ));
    }
    only_params(&q, &["at", "from", "to"])?;
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let settings = app.config.analytics.clone();
    if q.contains_key("from") || q.contains_key("to") {
        if q.contains_key("at") {
            return Err(ApiError::bad_request(
                "at",
                "give either at, or from and to",
            ));
        }
        let (from, to) = range_params(
            q.get("from").map(String::as_str),
            q.get("to").map(String::as_str),
            app.config.retention.rollup_secs,
        )?;
        let v = tokio::task::spawn_blocking(move || over_range(&conn, from, to, &settings))
            .await
            .map_err(|e| ApiError::internal(&e))?
            .map_err(|e| ApiError::internal(&e))?;
        return Ok(Json(v));
    }
    let at = time_param("at", q.get("at").map(String::as_str))?
        .unwrap_or_else(|| chrono::Utc::now().timestamp());
    let v = tokio::task::spawn_blocking(move || at_instant(&conn, at, &settings))
        .await
        .map_err(|e| ApiError::internal(&e))?
        .map_err(|e| ApiError::internal(&e))?;
    Ok(Json(v))
}

fn ge(slices: f64) -> f64 {
    slices / f64::from(SLICES_PER_GPU)
}

fn demand_json(d: &fragmentation::DemandMix, models: &[String]) -> Value {
    let mut out = BTreeMap::new();
    for name in models {
        if let Some(m) = gpuledger_schema::mig::model(name) {
            let w: BTreeMap<&str, f64> = d.for_model(m).weights().collect();
            out.insert(m.key, w);
        }
    }
    json!(out)
}

fn at_instant(
    conn: &duckdb::Connection,
    at: i64,
    settings: &analytics::Settings,
) -> duckdb::Result<Value> {
    let demand = analytics::demand_mix(conn, settings, at)?;
    let dims = analytics::facts::Dims::load(conn)?;
    let gpus = fragmentation::at(conn, &dims, at, MAX_AGE_SECS, &demand, true)?;
    let mut nodes: BTreeMap<&str, (u64, f64, f64)> = BTreeMap::new();
    let mut models: Vec<String> = Vec::new();
    let mut rows = Vec::with_capacity(gpus.len());
    let mut advice = Vec::new();
    for g in &gpus {
        let f = &g.fragmentation;
        let n = nodes.entry(&g.gpu.node).or_default();
        n.0 += 1;
        n.1 += ge(f64::from(f.free_slices));
        n.2 += ge(f.stranded_slices);
        if !models.contains(&g.gpu.gpu_model) {
            models.push(g.gpu.gpu_model.clone());
        }
        rows.push(json!({
            "node": g.gpu.node,
            "gpu_uuid": g.gpu.gpu_uuid,
            "gpu_model": g.gpu.gpu_model,
            "observed_at": g.observed_at,
            "free_slots": f.free_slots,
            "free_gpu_equivalents": ge(f64::from(f.free_slices)),
            "largest_placeable_profile": f.largest_placeable_profile,
            "stranded_gpu_equivalents": ge(f.stranded_slices),
            "instances": g.instances,
        }));
        if let Some(a) = &g.advice {
            let pick = |ks: &[usize]| -> Vec<Value> {
                ks.iter().map(|&k| json!(g.instances[k])).collect()
            };
            advice.push(json!({
                "node": g.gpu.node,
                "gpu_uuid": g.gpu.gpu_uuid,
                "gpu_model": g.gpu.gpu_model,
                "destroy": pick(&a.destroy),
                "create": a.create.iter().map(|(p, s)| json!({"mig_profile": p, "placement_start": s})).collect::<Vec<_>>(),
                "displaces": pick(&a.displace),
                "stranded_gpu_equivalents_before": ge(f.stranded_slices),
                "stranded_gpu_equivalents_after": ge(a.stranded_slices_after),
            }));
        }
    }
    let fleet = nodes
        .values()
        .fold((0u64, 0.0, 0.0), |a, n| (a.0 + n.0, a.1 + n.1, a.2 + n.2));
    Ok(json!({
        "at": at,
        "gpus": rows,
        "nodes": nodes.iter().map(|(node, (gpus, free, stranded))| json!({
            "node": node, "gpus": gpus, "free_gpu_equivalents": free, "stranded_gpu_equivalents": stranded,
        })).collect::<Vec<_>>(),
        "fleet": {
            "gpus": fleet.0,
            "free_gpu_equivalents": fleet.1,
            "stranded_gpu_equivalents": fleet.2,
            "stranded_ratio": if fleet.0 > 0 { fleet.2 / fleet.0 as f64 } else { 0.0 },
        },
        "demand": demand_json(&demand, &models),
        "advice": advice,
    }))
}

fn over_range(
    conn: &duckdb::Connection,
    from: i64,
    to: i64,
    settings: &analytics::Settings,
) -> duckdb::Result<Value> {
    // Whole hours from the stored table; the edges second by second.
    let (h0, h1) = (
        from + (3600 - from.rem_euclid(3600)) % 3600,
        to - to.rem_euclid(3600),
    );
    let mut per_gpu: BTreeMap<fragmentation::GpuKey, (i64, f64, f64)> = BTreeMap::new();
    let mut add = |h: fragmentation::GpuHour| {
        let e = per_gpu.entry(h.gpu).or_default();
        e.0 += h.observed_seconds;
        e.1 += h.free_slice_seconds;
        e.2 += h.stranded_slice_seconds;
    };
    let demand = analytics::demand_mix(conn, settings, to)?;
    let dims = analytics::facts::Dims::load(conn)?;
    if h0 < h1 {
        let mut stmt = conn.prepare_cached(
            "SELECT node, gpu_uuid, gpu_model, sum(observed_seconds)::BIGINT,
                    sum(free_slice_seconds), sum(stranded_slice_seconds)
             FROM fragmentation_1h WHERE bucket >= ? AND bucket < ? GROUP BY ALL",
        )?;
        let rows = stmt.query_map(duckdb::params![h0, h1], |r| {
            Ok(fragmentation::GpuHour {
                bucket: h0,
                gpu: fragmentation::GpuKey {
                    node: r.get(0)?,
                    gpu_uuid: r.get(1)?,
                    gpu_model: r.get(2)?,
                },
                observed_seconds: r.get(3)?,
                free_slice_seconds: r.get(4)?,
                stranded_slice_seconds: r.get(5)?,
            })
        })?;
        for row in rows {
            add(row?);
        }
        for (a, b) in [(from, h0), (h1, to)] {
            if a < b {
                fragmentation::over_range(conn, &dims, a, b, &demand)?
                    .into_iter()
                    .for_each(&mut add);
            }
        }
    } else {
        fragmentation::over_range(conn, &dims, from, to, &demand)?
            .into_iter()
            .for_each(&mut add);
    }
    let mut models: Vec<String> = Vec::new();
    let mut fleet = (0i64, 0.0, 0.0, 0.0);
    let mut nodes: BTreeMap<String, (i64, f64, f64, f64)> = BTreeMap::new();
    let gpus: Vec<Value> = per_gpu
        .iter()
        .map(|(g, (observed, free, stranded))| {
            if !models.contains(&g.gpu_model) {
                models.push(g.gpu_model.clone());
            }
            let cost = ge(*stranded) * price_per_gpu_second(settings, &g.gpu_model);
            for t in [&mut fleet, nodes.entry(g.node.clone()).or_default()] {
                t.0 += observed;
                t.1 += ge(*free);
                t.2 += ge(*stranded);
                t.3 += cost;
            }
            json!({
                "node": g.node,
                "gpu_uuid": g.gpu_uuid,
                "gpu_model": g.gpu_model,
                "observed_seconds": observed,
                "free_gpu_seconds": ge(*free),
                "stranded_gpu_seconds": ge(*stranded),
                "stranded_slice_seconds": stranded,
                "stranded_cost": cost,
            })
        })
        .collect();
    Ok(json!({
        "from": from,
        "to": to,
        "currency": settings.currency,
        "gpus": gpus,
        "nodes": nodes.iter().map(|(node, n)| json!({
            "node": node,
            "capacity_gpu_seconds": n.0,
            "free_gpu_seconds": n.1,
            "stranded_gpu_seconds": n.2,
            "stranded_cost": n.3,
        })).collect::<Vec<_>>(),
        "fleet": {
            "capacity_gpu_seconds": fleet.0,
            "free_gpu_seconds": fleet.1,
            "stranded_gpu_seconds": fleet.2,
            "stranded_cost": fleet.3,
        },
        "demand": demand_json(&demand, &models),
    }))
}
