//! The measured phases on one started cluster: YCSB Load and A through the primary's RESP
//! port (the YCSB driver unchanged, over `client`'s engine), and redis-benchmark's SET
//! tests. Around each phase the cluster settles (backups caught up with a commit) and
//! is sampled, so a phase's CPU, device and network figures include what replicating
//! its writes cost, up to the commit that covers them.
//!
//! Owns turning a phase into its record: the driver's record (client-side throughput and
//! latencies) with the harness's own CPU and I/O moved aside and the servers' figures
//! (`figures`) put in. Single-threaded (the YCSB driver's threads aside).

use std::path::Path;

use serde_json::Value;

use super::client::RespKind;
use super::cluster::{Cluster, Setup};
use super::figures::{phase_fields, Phase};
use super::sample::ClusterSample;
use crate::engine::{Engine, EngineConfig};
use crate::results::Record;
use crate::server::process::load_average;
use crate::server::redis_benchmark::{redis_benchmark, Shape};
use crate::server::resp::KEY_BYTES;
use crate::ycsb::{self, PhaseWatch, SizeMix, ValueLayout, YcsbConfig};
use crate::{sys, Result};

/// What the YCSB phases of one cluster run.
pub(super) struct YcsbPlan<'a> {
    pub(super) mix: SizeMix,
    pub(super) records: u64,
    pub(super) operations: u64,
    pub(super) threads: usize,
    pub(super) load_batch: usize,
    pub(super) seed: u64,
    /// Where the driver's (empty) engine directories go.
    pub(super) dir: &'a Path,
}

/// The name of a size mix in the records.
pub(super) fn mix_name(mix: SizeMix) -> &'static str {
    match mix {
        SizeMix::Small => "small",
        SizeMix::Medium => "medium",
        SizeMix::Large => "large",
        SizeMix::Sd => "sd",
    }
}

/// Settles and samples the cluster at the edges of the driver's phases.
struct Watch<'a> {
    cluster: &'a mut Cluster,
    samples: Vec<ClusterSample>,
    settle_s: Vec<f64>,
}

impl Watch<'_> {
    fn settle_and_sample(&mut self) -> Result<()> {
        self.settle_s.push(self.cluster.settle()?.as_secs_f64());
        self.samples.push(self.cluster.sample()?);
        Ok(())
    }
}

impl PhaseWatch for Watch<'_> {
    fn start(&mut self, _dir: &Path, _live_user_bytes: u64) -> Result<()> {
        self.settle_and_sample()
    }

    fn finish(&mut self, _engine: &dyn Engine, _record: &mut Record) -> Result<()> {
        self.settle_and_sample()
    }
}

/// YCSB Load, then A, on `cluster`: their two records.
pub(super) fn ycsb(cluster: &mut Cluster, plan: &YcsbPlan) -> Result<Vec<Record>> {
    let setup = cluster.setup;
    let kind = RespKind {
        port: cluster.primary.port,
    };
    let config = YcsbConfig {
        records: plan.records,
        operations: plan.operations,
        threads: plan.threads,
        layout: ValueLayout::Mix(plan.mix),
        load_batch: plan.load_batch,
        seed: plan.seed,
        dataset: mix_name(plan.mix).to_string(),
        engine: EngineConfig {
            sync_writes: true,
            ..EngineConfig::default()
        },
        dir: plan.dir.to_path_buf(),
    };
    let mut watch = Watch {
        cluster,
        samples: Vec::new(),
        settle_s: Vec::new(),
    };
    watch.settle_and_sample()?;
    let (load, a) = ycsb::load_and_run(&kind, &config, "ycsb_load", &ycsb::A, &mut watch)?;
    let [before, after_load, after_a] = &watch.samples[..] else {
        return Err("the YCSB driver skipped a phase".into());
    };
    let mut records = Vec::new();
    for (mut record, before, after, settle_s) in [
        (load, before, after_load, watch.settle_s[1]),
        (a, after_load, after_a, watch.settle_s[2]),
    ] {
        server_side(&mut record, setup, before, after);
        record.set("settle_s", settle_s);
        records.push(record);
    }
    Ok(records)
}

/// Replaces what the driver measured of its own process by the servers' figures: CPU
/// per operation is the primary's (the driver's goes to `client_cpu_us_per_op`), write
/// amplification the primary's device bytes written per user byte, space amplification
/// the primary's space used; the whole block device's bytes are kept apart.
fn server_side(record: &mut Record, setup: Setup, before: &ClusterSample, after: &ClusterSample) {
    record.engine = setup.name();
    let ops = record.get("ops").and_then(Value::as_u64).unwrap_or(0);
    let user_write_bytes = record
        .get("user_write_bytes")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    record.set("client_cpu_us_per_op", record.cpu_us_per_op);
    for name in [
        "process_read_bytes",
        "process_write_bytes",
        "device_io_amp_read",
        "device_io_amp_write",
        "space_used_bytes",
    ] {
        record.remove(name);
    }
    for (old, new) in [
        ("device_read_bytes", "block_device_read_bytes"),
        ("device_write_bytes", "block_device_write_bytes"),
    ] {
        if let Some(value) = record.remove(old) {
            record.set(new, value);
        }
    }
    let fields = phase_fields(&Phase {
        setup,
        before,
        after,
        user_write_bytes,
        ops,
    });
    let number = |name: &str| fields.get(name).and_then(Value::as_f64);
    record.cpu_us_per_op = number("primary_cpu_s").map(|s| s * 1e6 / ops.max(1) as f64);
    record.io_amp_read = None;
    record.io_amp_write = number("primary_device_write_bytes")
        .filter(|_| user_write_bytes > 0)
        .map(|b| b / user_write_bytes as f64);
    let live = record
        .get("live_user_bytes")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    record.space_amp = number("primary_space_used_bytes")
        .filter(|_| live > 0.0)
        .map(|b| b / live);
    for (name, value) in fields {
        record.set(&name, value);
    }
    record.set("load_average", load_average());
}

/// What the redis-benchmark tests of one cluster ask for.
pub(super) struct RedisPlan<'a> {
    pub(super) program: &'a Path,
    pub(super) shape: Shape,
    pub(super) pipelines: &'a [u64],
}

/// `redis-benchmark -t set` at each pipeline depth on `cluster`: a record each.
pub(super) fn redis_sets(cluster: &mut Cluster, plan: &RedisPlan) -> Result<Vec<Record>> {
    let setup = cluster.setup;
    let mut records = Vec::new();
    cluster.settle()?;
    let mut before = cluster.sample()?;
    for &pipeline in plan.pipelines {
        let client_before = sys::children_cpu_time();
        let result = redis_benchmark(
            plan.program,
            cluster.primary.port,
            &plan.shape,
            pipeline,
            "SET",
        )?;
        let client_cpu = sys::children_cpu_time().saturating_sub(client_before);
        let settle_s = cluster.settle()?.as_secs_f64();
        let after = cluster.sample()?;
        let requests = plan.shape.requests;
        let mut record = Record::unmeasured(setup.name(), &format!("redis-SET-P{pipeline}"));
        record.ops_per_sec = Some(result.requests_per_sec);
        record.p50_us = Some(result.p50_ms * 1000.0);
        record.p99_us = Some(result.p99_ms * 1000.0);
        record.set("dataset", "redis-benchmark");
        record.set("ops", requests);
        record.set("pipeline", pipeline);
        record.set("clients", plan.shape.clients);
        record.set("value_bytes", plan.shape.value_bytes);
        record.set("keyspace", plan.shape.keys);
        record.set("avg_latency_us", result.avg_ms * 1000.0);
        record.set("max_latency_us", result.max_ms * 1000.0);
        record.set("elapsed_s", result.elapsed.as_secs_f64());
        record.set(
            "client_cpu_us_per_op",
            client_cpu.as_secs_f64() * 1e6 / requests.max(1) as f64,
        );
        record.set("settle_s", settle_s);
        let user_write_bytes = requests * (KEY_BYTES + plan.shape.value_bytes);
        let fields = phase_fields(&Phase {
            setup,
            before: &before,
            after: &after,
            user_write_bytes,
            ops: requests,
        });
        let number = |name: &str| fields.get(name).and_then(Value::as_f64);
        record.cpu_us_per_op = number("primary_cpu_s").map(|s| s * 1e6 / requests.max(1) as f64);
        record.io_amp_write =
            number("primary_device_write_bytes").map(|b| b / user_write_bytes.max(1) as f64);
        for (name, value) in fields {
            record.set(&name, value);
        }
        record.set("load_average", load_average());
        records.push(record);
        before = after;
    }
    Ok(records)
}
