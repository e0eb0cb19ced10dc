#!/usr/bin/env bash
# Smoke test of the benchmark harness itself, for CI: the whole suite on tiny data sets
# (seconds), GC runs included, Tucana only (no peer is built), then the report from its
# JSON; then the cold-scan command on a tiny data set and the report with its section.
# Checks that every phase ran and verified its answers and that the JSON and document have
# what they must; asserts nothing about speed. Where redis-benchmark and
# redis-server are installed (scripts/server-deps.sh --bench), also the `server`,
# `replication` and `cluster-compare` commands on tiny counts; elsewhere that part is
# skipped with a message, never failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

# The test profile (opt-level 1, what `cargo test` built every dependency with just
# before in CI): the dev profile would build the whole tree again at opt-level 0, about
# five of CI's minutes. Both put their binaries in target/debug.
cargo build -q --profile test -p tucana-bench
bench="${CARGO_TARGET_DIR:-target}/debug/tucana-bench"
"${bench}" suite --quick --engines tucana --dir "${work}" --json "${work}/results.json" \
    --note "smoke test" </dev/null >"${work}/suite.log"
"${bench}" report "${work}/results.json" --out "${work}/BENCHMARKS.md" \
    --plots-dir "${work}/plots" >/dev/null

python3 - "${work}/results.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
records = doc["records"]
required = ["engine", "workload", "ops_per_sec", "cpu_us_per_op", "io_amp_write",
            "io_amp_read", "space_amp", "p50_us", "p99_us", "p999_us", "peak_rss_bytes"]
for record in records:
    missing = [f for f in required if f not in record]
    assert not missing, f"{record['workload']}: missing {missing}"
workloads = {r["workload"] for r in records}
for w in ["ycsb_load", "ycsb_a", "ycsb_b", "ycsb_c", "ycsb_f", "ycsb_d", "ycsb_reload",
          "ycsb_e", "fillseq", "fillrandom", "readrandom", "seekrandom", "deleterandom",
          "gc_load", "gc_ycsb_a", "delete_all"]:
    assert w in workloads, f"no {w} record"
gc_runs = {r["gc"] for r in records if r["workload"] == "gc_ycsb_a"}
assert gc_runs == {"on", "off"}, f"GC runs: {gc_runs}"
for r in records:
    if r["workload"] == "gc_ycsb_a":
        for f in ["space_amp_max", "space_amp_final", "gc_relocated_bytes"]:
            assert f in r, f"gc_ycsb_a (GC {r['gc']}): no {f}"
    if r["workload"] == "delete_all":
        for f in ["empty_space_bytes", "loaded_space_bytes", "reclaimed_space_bytes"]:
            assert f in r, f"delete_all: no {f}"
for key in ["cores", "mem_total_bytes", "kernel", "disk"]:
    assert key in doc["machine"], f"machine.{key} missing"
assert all(r["ops_per_sec"] > 0 for r in records)
print(f"bench smoke: {len(records)} records OK")
PY
grep -q "## Absolute figures" "${work}/BENCHMARKS.md"
grep -q "ycsb_e" "${work}/BENCHMARKS.md"

# The second mode: a sync per write, joined to the same document.
# It also samples where each phase's time went (--offcpu), which the report shows as a
# section of its own.
"${bench}" suite --quick --sync --gc-records 0 --engines tucana --dir "${work}" --offcpu \
    --json "${work}/sync.json" --note "smoke test" </dev/null >"${work}/sync.log"
python3 - "${work}/sync.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["options"]["offcpu"] is True
measured = [r for r in doc["records"] if "ops" in r]
assert measured, "no measured record"
for record in measured:
    figures = record.get("offcpu")
    assert isinstance(figures, dict), f"{record['workload']}: no offcpu figures"
    for group in ["clients", "engine"]:
        for field in ["run_frac", "runnable_frac", "blocked_frac", "top_waits"]:
            assert field in figures[group], f"{record['workload']}: no offcpu.{group}.{field}"
    assert "bad_lines" not in figures, f"{record['workload']}: {figures.get('first_bad_line')}"
print(f"bench smoke: offcpu figures in {len(measured)} records")
PY
"${bench}" report "${work}/results.json" --offcpu-json "${work}/sync.json" \
    --out "${work}/BENCHMARKS-offcpu.md" --plots-dir "${work}/plots" >/dev/null
grep -q "^## Where the time went: " "${work}/BENCHMARKS-offcpu.md"
"${bench}" report "${work}/results.json" --sync-json "${work}/sync.json" \
    --out "${work}/BENCHMARKS-sync.md" --plots-dir "${work}/plots" >/dev/null
grep -q ", sync per write |" "${work}/BENCHMARKS-sync.md"
grep -q "## Garbage collection" "${work}/BENCHMARKS.md"
grep -q "### Delete all, then reclaim" "${work}/BENCHMARKS.md"

# Cold scans (prefetch off and on), joined to the same document. The memory cgroup may not
# be available where CI runs; the command then says so and runs without the limit.
"${bench}" coldscan --quick --engines tucana --dir "${work}" --json "${work}/coldscan.json" \
    --note "smoke test" </dev/null >"${work}/coldscan.log"
"${bench}" report "${work}/results.json" --coldscan-json "${work}/coldscan.json" \
    --out "${work}/BENCHMARKS-cold.md" --plots-dir "${work}/plots" >/dev/null
python3 - "${work}/coldscan.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
records = doc["records"]
for workload in ["cold-scan-forward", "cold-scan-reverse", "cold-seek-next",
                 "cold-multi-get-batch", "hot-scan-forward"]:
    settings = [r["prefetch"] for r in records
                if r["engine"] == "tucana" and r["workload"] == workload]
    assert settings == ["off", "on"], f"{workload}: prefetch runs {settings}"
for r in records:
    for field in ["ops_per_sec", "items_per_sec", "cpu_us_per_op", "io_amp_read", "checksum"]:
        assert field in r, f"{r['workload']}: no {field}"
    assert r["ops_per_sec"] > 0
    if r["workload"] in ("cold-scan-forward", "cold-scan-reverse"):
        assert r["items"] == doc["options"]["keys"], f"{r['workload']}: {r['items']} items"
assert "tucana" in doc["options"]["cgroups"]
print(f"coldscan smoke: {len(records)} records OK")
PY
grep -q "## Cold scans" "${work}/BENCHMARKS-cold.md"
grep -q "report bench/results.json --coldscan-json" "${work}/BENCHMARKS-cold.md"

if command -v redis-benchmark >/dev/null 2>&1 && command -v redis-server >/dev/null 2>&1; then
    # tucana-cli links the cluster crate, whose etcd client is built with protoc.
    bash scripts/cluster-deps.sh --protoc-only
    cargo build -q --profile test -p tucana-cli
    "${bench}" server --quick --dir "${work}" --json "${work}/server-results.json" \
        --memory-limit-bytes $((256 << 20)) --note "smoke test" </dev/null >"${work}/server.log"
    "${bench}" report "${work}/results.json" --server-json "${work}/server-results.json" \
        --out "${work}/BENCHMARKS.md" --plots-dir "${work}/plots" >/dev/null
    python3 - "${work}/server-results.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
records = doc["records"]
for server in ["redis-everysec", "tucana-buffered", "tucana-sync"]:
    for test in ["load", "redis-SET-P1", "redis-GET-P1", "redis-SET-P16", "redis-GET-P16"]:
        found = [r for r in records if r["engine"] == server and r["workload"] == test
                 and r["dataset"] == "in-memory"]
        assert found, f"no {server} {test} record"
        assert found[0]["ops_per_sec"] > 0
        for field in ["p50_us", "p99_us", "cpu_us_per_op", "peak_rss_bytes"]:
            assert field in found[0], f"{server} {test}: no {field}"
large = [r for r in records if r["dataset"] == "larger-than-memory"]
assert large or "failed" in doc["options"]["larger_than_memory"], "no larger-than-memory records"
print(f"server smoke: {len(records)} records OK")
PY
    grep -q "Tucana ÷ redis-server" "${work}/BENCHMARKS.md"

    # Replication: a primary alone and with send-index and build-index backups (separate
    # `tucana serve` processes; one send-index backup also with --repl-ack durable and with
    # --repl-index-lag-ms 0), YCSB Load and A per size mix, redis-benchmark SETs, a failover.
    "${bench}" replication --quick --dir "${work}" --json "${work}/replication-results.json" \
        --note "smoke test" </dev/null >"${work}/replication.log"
    "${bench}" report "${work}/results.json" --server-json "${work}/server-results.json" \
        --replication-json "${work}/replication-results.json" \
        --out "${work}/BENCHMARKS.md" --plots-dir "${work}/plots" >/dev/null
    python3 - "${work}/replication-results.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
records = doc["records"]
setups = ["unreplicated", "send-index-1", "send-index-1-durable", "send-index-1-every-commit",
          "build-index-1", "send-index-2", "build-index-2"]
assert doc["options"]["setups"] == setups, doc["options"]["setups"]
def find(setup, dataset, workload):
    found = [r for r in records if r["engine"] == setup and r["dataset"] == dataset
             and r["workload"] == workload]
    assert len(found) == 1, f"{setup} {dataset} {workload}: {len(found)} records"
    return found[0]
phases = [(mix, w) for mix in ["small", "medium", "large"] for w in ["ycsb_load", "ycsb_a"]]
phases.append(("redis-benchmark", "redis-SET-P16"))
for setup in setups:
    for dataset, workload in phases:
        r = find(setup, dataset, workload)
        assert r["ops_per_sec"] > 0, f"{setup} {dataset} {workload}"
        for field in ["p99_us", "cpu_us_per_op", "primary_cpu_s", "primary_device_write_bytes",
                      "user_write_bytes", "load_average"]:
            assert field in r, f"{setup} {dataset} {workload}: no {field}"
        if setup == "unreplicated":
            continue
        for field in ["backup_cpu_ns_per_log_byte", "backup_log_cpu_ns_per_log_byte",
                      "backup_index_cpu_ns_per_log_byte", "backup_other_cpu_ns_per_log_byte",
                      "backup_device_write_bytes_per_user_byte",
                      "backup_device_read_bytes_per_user_byte", "network_bytes_per_log_byte",
                      "network_bytes_per_user_byte", "index_bytes_per_log_byte"]:
            assert field in r, f"{setup} {dataset} {workload}: no {field}"
        backups = int(setup.split("-")[2])  # send-index-N[-variant], build-index-N
        assert len(r["backups"]) == backups, f"{setup}: {len(r['backups'])} backups"
        assert r["log_bytes_per_backup"] > 0, f"{setup} {dataset} {workload}: no log shipped"
failover = find("send-index-1", "failover", "failover")
for field in ["failover_ms", "promote_ms", "replay_log_bytes", "data_bytes"]:
    assert field in failover, f"failover: no {field}"
assert failover["verified"] is True
print(f"replication smoke: {len(records)} records OK")
PY
    grep -q "## Replication: send-index and build-index backups" "${work}/BENCHMARKS.md"
    grep -q "### Issue 18's targets" "${work}/BENCHMARKS.md"
    grep -q "### Acknowledgement: received or durable" "${work}/BENCHMARKS.md"
    grep -q "### Folding commits or shipping every commit's index" "${work}/BENCHMARKS.md"

    # Redis Cluster side by side (issue 19): each system's cluster (Redis: 6 redis-server
    # processes; Tucana: etcd and 3 servers, sync and buffered) on tiny counts, one kill -9
    # cycle each with a 2 s node timeout / lease.
    bash scripts/cluster-deps.sh
    "${bench}" cluster-compare --quick --dir "${work}" --json "${work}/cluster-results.json" \
        --note "smoke test" </dev/null >"${work}/cluster.log"
    "${bench}" report "${work}/results.json" --server-json "${work}/server-results.json" \
        --replication-json "${work}/replication-results.json" \
        --cluster-json "${work}/cluster-results.json" \
        --out "${work}/BENCHMARKS.md" --plots-dir "${work}/plots" >/dev/null
    python3 - "${work}/cluster-results.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
records = doc["records"]
systems = ["redis-cluster", "tucana-sync", "tucana-buffered"]
assert doc["options"]["systems"] == systems, doc["options"]["systems"]
def find(system, workload):
    found = [r for r in records if r["engine"] == system and r["workload"] == workload]
    assert len(found) == 1, f"{system} {workload}: {len(found)} records"
    return found[0]
for system in systems:
    for test in ["SET -P 1", "GET -P 1"]:
        r = find(system, test)
        assert r["ops_per_sec"] > 0 and r["p99_us"] is not None, f"{system} {test}"
    cycle = find(system, "kill -9 cycle")
    assert len(cycle["failover_ms"]) >= 1, f"{system}: no failover time"
    assert cycle["acknowledged"] > 0, f"{system}: nothing acknowledged"
    end = find(system, "read back at the end")
    assert end["acknowledged"] == cycle["acknowledged"]
# Sync writes are answered once the backup has them: a kill -9 of the primary loses none.
assert find("tucana-sync", "kill -9 cycle")["lost"] == 0
assert find("tucana-sync", "read back at the end")["lost"] == 0
print(f"cluster-compare smoke: {len(records)} records OK")
PY
    grep -q "## Redis Cluster side by side" "${work}/BENCHMARKS.md"
    grep -q "### Kill -9 of a master under acknowledged writes" "${work}/BENCHMARKS.md"
else
    echo "bench smoke: skipping the server and replication benchmarks: redis-benchmark or redis-server is not" \
        "installed (scripts/server-deps.sh --bench installs them)"
fi
echo "bench smoke: passed"
