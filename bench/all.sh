#!/usr/bin/env bash
# Every performance figure the docs promise, as one table: builds
# once (release), runs each bench below, collects the RESULT lines they print
# (ctcache_testkit::Figure) and prints figure, value, anchor measured in the
# same run, ratio, target, met or not. Each bench still runs alone (its own
# command below); its log, prose included, is kept in the work folder.
#
#   bench/all.sh [--only NAME,...] [--markdown] [--keep-logs]
#       --only      run only these benches (names below)
#       --markdown  also write the table into docs/PERFORMANCE.md between its
#                   markers (with --only: just the rows of those benches, the
#                   note says which command measured them on what machine,
#                   without a date: the docs carry none), then README.md's
#                   headline summary from that table (bench/results.py HEADLINE)
#   bench/all.sh --check-table    docs/PERFORMANCE.md's table has exactly the
#                                 figures declared below and README.md's summary
#                                 is what that table gives (runs no bench: cheap
#                                 enough for CI; --check-readme is an old name)
#   bench/all.sh --list           the benches and their figures
#
# Timings are only meaningful on a quiet machine: nothing else building.
# Environment: CARGO_TARGET_DIR (default /var/tmp/ctcache-target), and each
# bench's own (see its header).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}"

NAMES=()
declare -A COMMAND FIGURES
# bench NAME COMMAND FIGURE...: the command prints a RESULT line per figure.
bench() {
  local name=$1 command=$2
  shift 2
  NAMES+=("$name")
  COMMAND[$name]=$command
  FIGURES[$name]="$*"
}

# ---- the benches: one line each (brace expansion lists figures) ----
bench digest       "bench/digest_bench.sh"                            digest.{b3sum,rss_anon,memory}
bench pack         "bench/pack_bench.sh"                              pack.{ort.matmul_nbits,ggml.q8_0,ggml.q4_0,cast.f16}.{cpu,wgpu,scalar,avx2,avx512,neon} pack.rss pack.ort.quantize_dynamic.{qd_tensor,qd_channel} pack.ort.float16.fp16
bench store        "cargo bench -q -p ctcache --bench store_bench"    store.{put,open,rebuild,lookups,gc_plan,gc}
bench daemon       "cargo bench -q -p ctcached --bench daemon_bench"  daemon.{lookup_p50,lookup_p99,lookup_mt_p50,lookup_mt_p99,batch_full,batch_brief,resolve_p50,watched_overhead}
bench open_payload "bench/open_payload_bench.sh"                      open_payload.{ttfb,throughput,consume,pss,first_serve}
bench materialize  "bench/materialize_bench.sh"                       materialize.cold{,.memory} materialize.{warm,warm_rpc,warm_bytes}.{auto,hard,memory}
bench minilm       "bench/materialize_bench.sh --shape minilm --warm-runs 5" materialize.minilm.cold{,.memory} materialize.minilm.{warm,warm_rpc,warm_bytes}.{auto,hard,memory}
bench int8         "bench/materialize_bench.sh --target int8"         materialize.int8.cold{,.memory} materialize.int8.{warm,warm_rpc,warm_bytes}.{auto,hard,memory}
bench fp16         "bench/materialize_bench.sh --target fp16"         materialize.fp16.cold{,.memory} materialize.fp16.{warm,warm_rpc,warm_bytes}.{auto,hard,memory} materialize.fp16.warm.form
bench large        "bench/large_model_bench.sh"                       materialize.large.{int4,int8,fp16}.{local,daemon}.{seconds,rss_mib}
bench session      "bench/session_bench.sh"                           session.{minilm,conv}.{warm.p1,warm.p4,reference.p1,floor.p1,form.p1,form.p4,own.p1,form_cold.p1,ov_form.p1,ov_form.p4,ov_cache.p1,ov_form_cold.p1,form.rss_mib,ov_form.rss_mib}
bench load         "bench/load_bench.sh"                              load.{resolve,lookup,open,release,read,gc}_{p50,p99} load.rss_growth
bench fleet        "bench/fleet_bench.sh"                             fleet.{ort.matmul_nbits,gemm.pack_b.f32}.{remote,auto,bytes} fleet.form.{minilm.ort,conv.ort,minilm.ov}
bench soak         "tests/soak.sh --seconds 60"                       soak.{restart_p99,wrong_bytes,lost}
# ---------------------------------------------------------------------

DOC=docs/PERFORMANCE.md   # the table; README.md has the headline summary
declared() { for n in "${NAMES[@]}"; do printf '%s\n' ${FIGURES[$n]}; done; }

only="" markdown=0 keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only=${2:?--only NAME,...}; shift ;;
    --markdown) markdown=1 ;;
    --keep-logs) keep=1 ;;
    --list)
      for n in "${NAMES[@]}"; do printf '%-13s %s\n%-13s   %s\n' "$n" "${COMMAND[$n]}" "" "${FIGURES[$n]}"; done
      exit 0 ;;
    --check-table|--check-readme)
      list=$(mktemp); trap 'rm -f "$list"' EXIT
      declared >"$list"
      python3 bench/results.py check "$list" "$DOC" --summary README.md
      echo "$DOC's performance table has exactly the $(wc -l <"$list") figures bench/all.sh declares; README.md's summary matches it"
      exit 0 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

run=("${NAMES[@]}")
if [ -n "$only" ]; then
  IFS=, read -r -a run <<<"$only"
  for n in "${run[@]}"; do
    [ -n "${COMMAND[$n]:-}" ] || { echo "no bench named $n (see --list)" >&2; exit 2; }
  done
fi

work=$(mktemp -d /var/tmp/ctcache-bench-all.XXXXXX)
[ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT
declared >"$work/figures"

echo "==> build (release: binaries and benches, once)"
cargo build --release -q --workspace --bins
cargo bench -q --workspace --no-run --bench '*' 2>&1 | grep -v '^ *Executable' || true

failed=()
for n in "${run[@]}"; do
  echo "==> $n: ${COMMAND[$n]}"
  # The previous bench's files (written, then deleted) go back to disk
  # before this one starts, not under its timings.
  sync
  start=$(date +%s)
  # Each bench's own build step finds everything fresh.
  if bash -c "${COMMAND[$n]}" 2>&1 | tee "$work/$n.log" | sed 's/^/    /'; then
    echo "    ($n: $(($(date +%s) - start)) s)"
  else
    failed+=("$n")
    echo "    ($n FAILED after $(($(date +%s) - start)) s; its figures are not measured)"
  fi
done

echo
echo "==> performance table ($(date -u +%Y-%m-%d), $(nproc) CPUs, $(uname -m))"
logs=()
for n in "${run[@]}"; do logs+=("$work/$n.log"); done
python3 bench/results.py table "$work/figures" "${logs[@]}"
if [ "$markdown" = 1 ]; then
  cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
  if [ -n "$only" ]; then
    python3 bench/results.py markdown "$work/figures" "${logs[@]}" --doc "$DOC" --update \
      --note "The rows of $only: \`bench/all.sh --only $only --markdown\` ($(nproc) CPUs, $(uname -m), Linux $(uname -r))."
  else
    python3 bench/results.py markdown "$work/figures" "${logs[@]}" --doc "$DOC" \
      --note "Measured by \`bench/all.sh --markdown\`: $(nproc) CPUs ($cpu), $(uname -m), Linux $(uname -r)."
  fi
  python3 bench/results.py summary "$DOC" README.md
fi
[ "$keep" = 0 ] || echo "logs kept in $work"
[ ${#failed[@]} -eq 0 ] || { echo "benches that failed: ${failed[*]}" >&2; exit 1; }
