//! `tucana-bench`: the benchmark harness that runs the same workloads on Tucana and on its
//! peers (RocksDB, LMDB, fjall, redb; each behind a cargo feature) and writes the results.
//!
//! Layout: `workload` generates keys, values and visiting orders from a seed; `ycsb` holds
//! YCSB's generators and core workloads; `micro` the db_bench-style phases; `recovery` the
//! open-after-crash benchmark; `gc` the garbage-collection runs (overwrite with GC on and
//! off, delete-all then reclaim); `suite` runs all of it on every engine and data set (the
//! larger-than-memory one inside a memory cgroup from `cgroup`); `coldscan` the scans of a
//! data set the page cache cannot hold; `server` runs redis-benchmark against `tucana
//! serve` and redis-server (separate processes); `replication` a primary with send-index
//! and build-index backups (separate processes) under YCSB and redis-benchmark, and a
//! failover; `cluster_compare` Redis Cluster and a Tucana cluster side by side
//! (redis-benchmark --cluster, kill -9 of a master under acknowledged writes). `measure` times phases (wall, process
//! CPU, I/O, peak RSS, latency histograms); `engine` puts each engine behind one trait;
//! `results` holds the records, prints the table and writes the JSON results file;
//! `document` is the `report` command, which turns the results files into BENCHMARKS.md
//! and its plots; `format` writes figures the same way for the terminal and the document;
//! `sys` holds the libc calls.
//!
//! Every run works in a fresh temporary directory under `--dir`, removed afterwards, so
//! runs never see each other's files.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

mod cgroup;
mod cluster_compare;
mod coldscan;
mod devices;
mod document;
mod engine;
mod format;
mod gc;
mod measure;
mod micro;
mod offcpu;
mod recovery;
mod replication;
mod results;
mod server;
mod suite;
mod sys;
mod workload;
mod ycsb;

/// Errors of a benchmark run: an engine error, an I/O error or a failed check.
pub type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

#[derive(Parser, Debug)]
#[command(name = "tucana-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// db_bench-style phases: fillseq (a store of its own), then on one data set
    /// fillrandom, readrandom, readseq, readreverse, overwrite, seekrandom, deleterandom.
    Micro(MicroArgs),
    /// Open time after a crash, by committed data set and by uncommitted log tail.
    Recovery(RecoveryArgs),
    /// Garbage collection: YCSB A overwriting the data set several times with GC on and
    /// off (throughput, space amplification), and delete-all then reclaim (disk bytes).
    Gc(gc::GcArgs),
    /// The full comparison: YCSB (in memory and larger than memory) and micro phases on
    /// every engine, one JSON file of all results.
    Suite(suite::SuiteArgs),
    /// Writes BENCHMARKS.md and its plots from a suite's JSON file.
    Report(document::ReportArgs),
    /// Cold scans (forward, reverse, seek + nexts) of a data set larger than the memory
    /// limit on every engine, Tucana with scan prefetch off and on; one JSON file that
    /// `report --coldscan-json` adds to BENCHMARKS.md.
    Coldscan(coldscan::ColdScanArgs),
    /// redis-benchmark against `tucana serve` and redis-server (in memory, and Tucana
    /// alone larger than memory), one JSON file that `report` adds to BENCHMARKS.md.
    Server(server::ServerArgs),
    /// A primary alone, with one and with two backups (send-index and build-index), as
    /// separate `tucana serve` processes: YCSB Load and A in Talos's size mixes,
    /// redis-benchmark SETs, and a failover; one JSON file that `report` adds to
    /// BENCHMARKS.md.
    Replication(replication::ReplicationArgs),
    /// Redis Cluster (3 masters + 1 replica each, AOF everysec) and a Tucana cluster (3
    /// servers, 1 backup per region; sync, and buffered) on this machine:
    /// redis-benchmark --cluster SET/GET, and kill -9 of a master under acknowledged
    /// writes (failover time, writes lost); one JSON file that `report` adds to
    /// BENCHMARKS.md.
    ClusterCompare(cluster_compare::ClusterCompareArgs),
    /// One load of a volume over the given member files (one or several), with a dispatch
    /// policy and writes in flight per member: `scripts/bench-devices.sh` runs it over
    /// throttled loop devices for the cases of issue 21; prints one line (and appends a
    /// JSON record with --json).
    Devices(devices::DevicesArgs),
}

#[derive(Args, Debug)]
struct CommonArgs {
    /// Engine to run.
    #[arg(long, value_enum, default_value_t = EngineChoice::Tucana)]
    engine: EngineChoice,
    /// Directory in which a temporary directory for the engine's files is created.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: PathBuf,
    /// Seed of every random choice: keys, values, orders.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Bytes per key.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=tucana::MAX_KEY_BYTES as u64))]
    key_bytes: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=tucana::MAX_VALUE_BYTES as u64))]
    value_bytes: u64,
    /// Also write the records as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct MicroArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Keys in the data set.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Threads sharing each phase's operations.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: u64,
    /// Make every write durable before it returns (default: buffered writes).
    #[arg(long)]
    sync: bool,
    /// Stop after this phase (e.g. `readrandom`, to profile fill and reads alone).
    #[arg(long)]
    stop_after: Option<String>,
    /// Keys shaped like redis-benchmark's: this prefix, then the key's number in decimal,
    /// zero-padded to --key-bytes (`--key-prefix key:` and 16-byte keys give
    /// `key:000000123456`). Default: random bytes. Scans split over --threads by the
    /// first two key bytes, so with a prefix one thread scans everything.
    #[arg(long)]
    key_prefix: Option<String>,
    /// Persist the index only at the phases' own commits, not also on the engine's
    /// timer: runs under valgrind (instruction counts) are ~50 times slower, so timed
    /// commits land at other points from run to run and blur the counts.
    #[arg(long)]
    manual_commit: bool,
    /// Tucana's address-space reservation for its volume mapping, in MiB (default: the
    /// engine's, 64 GiB). valgrind refuses the default: e.g. 1024 for callgrind.
    #[arg(long)]
    mapping_reservation_mib: Option<u64>,
}

#[derive(Args, Debug)]
struct RecoveryArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Committed data set sizes (comma-separated), each reopened with the first tail.
    #[arg(long, value_delimiter = ',', default_values_t = [100_000u64, 1_000_000], value_parser = clap::value_parser!(u64).range(1..))]
    data_sets: Vec<u64>,
    /// Uncommitted but synced tail lengths (comma-separated), each on the first data set.
    #[arg(long, value_delimiter = ',', default_values_t = [10_000u64, 100_000, 300_000])]
    tails: Vec<u64>,
}

/// Every engine the harness knows; peers exist only when built with their feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EngineChoice {
    Tucana,
    Rocksdb,
    Lmdb,
    Fjall,
    Redb,
}

impl EngineChoice {
    pub const ALL: [EngineChoice; 5] = [
        EngineChoice::Tucana,
        EngineChoice::Rocksdb,
        EngineChoice::Lmdb,
        EngineChoice::Fjall,
        EngineChoice::Redb,
    ];

    /// `chosen`, or every engine this build has when nothing was chosen.
    pub fn chosen_or_built(chosen: &[EngineChoice]) -> Vec<EngineChoice> {
        if chosen.is_empty() {
            EngineChoice::ALL
                .into_iter()
                .filter(|e| e.kind().is_ok())
                .collect()
        } else {
            chosen.to_vec()
        }
    }

    /// The engine, or why this build does not have it.
    pub fn kind(self) -> Result<&'static dyn engine::EngineKind, String> {
        // Unused when every feature is on.
        #[allow(dead_code)]
        fn missing(feature: &str) -> Result<&'static dyn engine::EngineKind, String> {
            Err(format!(
                "this tucana-bench was built without the `{feature}` feature (scripts/bench.sh builds all)"
            ))
        }
        match self {
            EngineChoice::Tucana => Ok(&engine::Tucana),
            #[cfg(feature = "rocksdb")]
            EngineChoice::Rocksdb => Ok(&engine::RocksDb),
            #[cfg(not(feature = "rocksdb"))]
            EngineChoice::Rocksdb => missing("rocksdb"),
            #[cfg(feature = "lmdb")]
            EngineChoice::Lmdb => Ok(&engine::Lmdb),
            #[cfg(not(feature = "lmdb"))]
            EngineChoice::Lmdb => missing("lmdb"),
            #[cfg(feature = "fjall")]
            EngineChoice::Fjall => Ok(&engine::Fjall),
            #[cfg(not(feature = "fjall"))]
            EngineChoice::Fjall => missing("fjall"),
            #[cfg(feature = "redb")]
            EngineChoice::Redb => Ok(&engine::Redb),
            #[cfg(not(feature = "redb"))]
            EngineChoice::Redb => missing("redb"),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tucana-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let mut machine = results::Machine::detect();
    let mut options = results::RunOptions::default();
    let mut records = Vec::new();
    let (command, common) = match &cli.command {
        Command::Micro(args) => ("micro", &args.common),
        Command::Recovery(args) => ("recovery", &args.common),
        Command::Suite(args) => return suite::run(args),
        Command::Gc(args) => return gc::run_command(args),
        Command::Report(args) => return document::run(args),
        Command::Coldscan(args) => return coldscan::run_command(args),
        Command::Server(args) => return server::run(args),
        Command::Replication(args) => return replication::run(args),
        Command::ClusterCompare(args) => return cluster_compare::run(args),
        Command::Devices(args) => return devices::run(args),
    };
    machine.disk = measure::watch_device_of(&common.dir);
    let kind = common.engine.kind()?;
    options.set("engine", kind.name());
    // Checked by clap against the engine's limits, so the casts cannot truncate.
    let key_bytes = common.key_bytes as usize;
    let value_bytes = common.value_bytes as usize;
    options.set("key_bytes", common.key_bytes);
    options.set("value_bytes", common.value_bytes);
    options.set("seed", common.seed);

    match &cli.command {
        Command::Micro(args) => {
            options.set("keys", args.keys);
            options.set("threads", args.threads);
            options.set("sync", args.sync);
            if let Some(prefix) = &args.key_prefix {
                options.set("key_prefix", prefix.clone());
            }
            if args.manual_commit {
                options.set("manual_commit", true);
            }
            if let Some(mib) = args.mapping_reservation_mib {
                options.set("mapping_reservation_mib", mib);
            }
            describe_dir(&common.dir, &mut options);
            results::print_header(command, &machine, &options);
            let config = micro::MicroConfig {
                keys: args.keys,
                key_bytes,
                key_prefix: args.key_prefix.as_ref().map(|p| p.as_bytes().to_vec()),
                value_bytes,
                threads: args.threads as usize,
                seed: common.seed,
                sync_writes: args.sync,
                dir: common.dir.clone(),
                stop_after: args.stop_after.clone(),
                engine: engine::EngineConfig {
                    background_commit: !args.manual_commit,
                    mapping_reservation_bytes: args.mapping_reservation_mib.map(|mib| mib << 20),
                    ..engine::EngineConfig::default()
                },
            };
            micro::run(kind, &config, &mut records)?;
        }
        Command::Recovery(args) => {
            options.set("data_sets", args.data_sets.clone());
            options.set("tails", args.tails.clone());
            describe_dir(&common.dir, &mut options);
            results::print_header(command, &machine, &options);
            let config = recovery::RecoveryConfig {
                data_sets: args.data_sets.clone(),
                tails: args.tails.clone(),
                key_bytes,
                value_bytes,
                seed: common.seed,
                dir: common.dir.clone(),
            };
            recovery::run(kind, &config, &mut records)?;
        }
        Command::Suite(_)
        | Command::Report(_)
        | Command::Coldscan(_)
        | Command::Server(_)
        | Command::Replication(_)
        | Command::ClusterCompare(_)
        | Command::Devices(_)
        | Command::Gc(_) => {
            unreachable!("returned above")
        }
    }

    if let Some(path) = &common.json {
        results::write_json(path, command, &machine, &options, &records)?;
        println!("\nrecords written to {}", path.display());
    }
    Ok(())
}

/// Records where the data goes and warns when it is not a real device.
pub(crate) fn describe_dir(dir: &Path, options: &mut results::RunOptions) {
    options.set("dir", dir.display().to_string());
    let fs = sys::fs_type(dir);
    if let Some(fs) = &fs {
        options.set("fs", fs.clone());
        if sys::fs_is_memory_backed(fs) {
            eprintln!(
                "WARNING: {} is on {fs}; the numbers measure memory, not an SSD (use --dir)",
                dir.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn micro_defaults_match_the_brief() {
        let cli = Cli::try_parse_from(["tucana-bench", "micro"]).unwrap();
        let Command::Micro(args) = cli.command else {
            panic!("not micro")
        };
        assert_eq!(args.keys, 1_000_000);
        assert_eq!(args.common.key_bytes, 16);
        assert_eq!(args.common.value_bytes, 100);
        assert_eq!(args.threads, 1);
        assert!(!args.sync);
    }

    #[test]
    fn coldscan_takes_its_flags() {
        let cli = Cli::try_parse_from([
            "tucana-bench",
            "coldscan",
            "--keys",
            "1000",
            "--value-bytes",
            "4000",
            "--dir",
            "/tmp",
        ])
        .unwrap();
        let Command::Coldscan(args) = cli.command else {
            panic!("not coldscan")
        };
        assert_eq!((args.keys, args.value_bytes), (1000, 4000));
        assert_eq!(args.prefetch_entries, 64);
        assert!(
            args.engines.is_empty(),
            "default: every engine of the build"
        );
        assert_eq!(args.memory_limit_bytes, 512 << 20);
        let cli =
            Cli::try_parse_from(["tucana-bench", "coldscan", "--engines", "tucana,lmdb"]).unwrap();
        let Command::Coldscan(args) = cli.command else {
            panic!("not coldscan")
        };
        assert_eq!(args.engines, [EngineChoice::Tucana, EngineChoice::Lmdb]);
        assert!(
            Cli::try_parse_from(["tucana-bench", "coldscan", "--prefetch-entries", "0"]).is_err()
        );
    }

    #[test]
    fn gc_defaults_match_the_brief() {
        let cli = Cli::try_parse_from(["tucana-bench", "gc"]).unwrap();
        let Command::Gc(args) = cli.command else {
            panic!("not gc")
        };
        let config = args
            .plan
            .config(
                false,
                gc::RunShape {
                    threads: 2,
                    layout: ycsb::ValueLayout::Fields {
                        fields: 1,
                        field_bytes: 100,
                    },
                    load_batch: 100,
                    seed: 1,
                    engine: engine::EngineConfig::default(),
                    dir: PathBuf::from("/tmp"),
                },
            )
            .unwrap();
        assert_eq!(config.records, 1_000_000);
        assert_eq!(config.overwrites, 4);
        assert_eq!(config.operations(), 8_000_000);
        assert_eq!(config.delete_records, 1_000_000);
        assert_eq!(config.gc_space_amp, 1.5);
    }

    #[test]
    fn recovery_lists_parse_and_zero_keys_is_refused() {
        let cli = Cli::try_parse_from([
            "tucana-bench",
            "recovery",
            "--tails",
            "0,5",
            "--data-sets",
            "7",
        ])
        .unwrap();
        let Command::Recovery(args) = cli.command else {
            panic!("not recovery")
        };
        assert_eq!(args.tails, vec![0, 5]);
        assert_eq!(args.data_sets, vec![7]);
        assert!(Cli::try_parse_from(["tucana-bench", "micro", "--keys", "0"]).is_err());
        assert!(Cli::try_parse_from(["tucana-bench", "micro", "--key-bytes", "0"]).is_err());
    }
}
