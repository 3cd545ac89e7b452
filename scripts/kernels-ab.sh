#!/usr/bin/env bash
# A/B of kernel builds on a noisy host: runs kernels_bench binaries in
# turns, ROUNDS times, and prints for each benchmark the median over the
# rounds of (time of binary N / time of the first binary, same round).
#
#   scripts/kernels-ab.sh ROUNDS "BIN_A BIN_B ..." FILTER...
#
# Each BIN is a kernels_bench executable (or a wrapper script setting an
# environment, e.g. BENCH_SPIN=1 or RAYON_NUM_THREADS=1); FILTERs select
# benchmarks as kernels_bench's arguments do. BENCH_REPS (default 5) is
# each run's best-of count. Why turns and per-round ratios: this host's
# speed moves by up to 1.6x within seconds, so two binaries timed a minute
# apart are not comparable, while two timed back to back mostly are.
set -euo pipefail
[[ $# -ge 3 ]] || { echo "usage: $0 ROUNDS \"BIN_A BIN_B ...\" FILTER..." >&2; exit 2; }
rounds=$1
read -r -a bins <<<"$2"
shift 2
[[ ${#bins[@]} -ge 2 ]] || { echo "$0: give at least two binaries" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((i = 1; i <= rounds; i++)); do
    for k in "${!bins[@]}"; do
        # "NAME  ours ... X ms | ..." (or, int8 rows, "NAME  int8 ... X ms
        # | f32 (ours) ...") -> "k|i|NAME|X": X is our time, the first one
        # (the reference's follows the bar).
        BENCH_REPS=${BENCH_REPS:-5} "${bins[$k]}" "$@" 2>&1 \
            | sed -n -e 's/^\(int8 .*[^ ]\) \{1,\}int8 .* \([0-9.]\{1,\}\) ms | f32 (ours).*/\1|\2/p' \
                -e 's/^\(.*[^ ]\) \{1,\}ours [^|]* \([0-9.]\{1,\}\) ms | .*/\1|\2/p' \
            | sed "s/^/$k|$i|/" >>"$out"
    done
done
python3 - "$out" "${bins[@]}" <<'EOF'
import collections, statistics, sys
path, bins = sys.argv[1], sys.argv[2:]
t = collections.defaultdict(dict)
names = []
for line in open(path):
    k, i, name, ms = line.rstrip("\n").split("|")
    t[(name, i)][int(k)] = float(ms)
    if name not in names:
        names.append(name)
print(f"{'':48s}" + "".join(f"{b.split('/')[-1][:14]:>16s}" for b in bins[1:]) + f"   (median time ratio vs {bins[0].split('/')[-1]})")
for name in names:
    cols = []
    for k in range(1, len(bins)):
        r = [v[k] / v[0] for (n, _), v in t.items() if n == name and k in v and 0 in v and v[0] > 0]
        cols.append(f"{statistics.median(r):16.3f}" if r else f"{'-':>16s}")
    print(f"{name:48s}" + "".join(cols))
EOF
