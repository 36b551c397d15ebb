#!/usr/bin/env bash
# The checks of one lent accelerator session, most wanted first, each under its own time
# limit inside one budget; every step's log, and the RESULTS.md sections the benchmarks
# write (--write), land under $OUT (default results/device).
#
#   bash benchmarks/on_device.sh [BUDGET_S [STEP ...]]   # default 480 s, every step
#
# Steps (in this order): devices secagg_stages secagg vs_pfl accelerator paaso_full scaling
# lora_memory; naming some runs only those (a rerun of what a first call did not finish).
# The machine may have no package registry: put wheels of what it lacks in .whl/ (installed
# offline, without dependencies, when present) and the datasets in $SWARMJAX_DATA (default
# results/data: mnist/ and shakespeare/, as `python -m swarmjax.data fetch` stages them).
# pfl-research is compared only where `python -c "import pfl"` works on the machine.
# Back here: `python -m benchmarks._results merge OUT/RESULTS.md` copies the new sections
# into benchmarks/RESULTS.md. docs/accelerators.md, "A lent GPU session".
set -u
steps="devices secagg_stages secagg vs_pfl accelerator paaso_full scaling lora_memory"
budget=${1:-480}
if ! [[ "$budget" =~ ^[0-9]+$ ]]; then
  echo "on_device.sh: BUDGET_S must be whole seconds (e.g. 480); got '$budget'" >&2
  exit 2
fi
for name in "${@:2}"; do
  if [[ " $steps " != *" $name "* ]]; then
    echo "on_device.sh: unknown step '$name'; the steps: $steps" >&2
    exit 2
  fi
done
only=" ${*:2} "
out=${OUT:-results/device}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SWARMJAX_DATA="${SWARMJAX_DATA:-$PWD/results/data}"
t0=$SECONDS
if compgen -G ".whl/*.whl" >/dev/null; then
  python -m pip install -q --no-index --no-deps .whl/*.whl >"$out/pip.log" 2>&1 ||
    echo "pip: some wheels did not install (see $out/pip.log)"
fi

wanted() { # wanted NAME: no step was named, or NAME was
  [[ "$only" == "  " || "$only" == *" $1 "* ]]
}

step() { # step NAME LIMIT_S COMMAND...: run it if wanted and the budget allows; log in $out/NAME.log
  local name=$1 limit=$2
  shift 2
  wanted "$name" || return 0
  local left=$((budget - (SECONDS - t0)))
  if ((left < 30)); then
    echo "== $name: skipped, ${left} s of the budget left"
    return
  fi
  ((limit > left)) && limit=$left
  echo "== $name (at most ${limit} s): $*"
  local began=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "   exit $? after $((SECONDS - began)) s; its last lines:"
  tr '\r' '\n' <"$out/$name.log" | tail -n 12 | sed 's/^/   /' # progress bars: one line each
}

step devices 60 python -c "import jax; print(jax.__version__, jax.devices())"
# issue 47: is the distributed round within 1.5x the central one where ChaCha20 is cheap?
step secagg_stages 90 python -m benchmarks.secagg_stages --cohort 50 --repeats 3
step secagg 150 python -m benchmarks.secagg --users 1200 --cohort 50 --rounds 3 --bits 16 \
  --central public --min-survivors 50 --write
if wanted vs_pfl; then # the DP round against the plain one, and pfl's
  if python -c "import pfl" >/dev/null 2>&1; then
    step vs_pfl 150 python -m benchmarks.vs_pfl --rounds 0 --timing-rounds 4 \
      --pfl-python "$(command -v python)" --write --out "$out/vs_pfl.json"
  else
    echo "== vs_pfl: skipped, pfl does not import here (carry its wheel in .whl/)"
  fi
fi
step accelerator 240 python -m benchmarks.accelerator --quick --write
step paaso_full 200 python -m experiments.paaso --full --jax-cache "" --out "$out/paaso"
if wanted scaling; then # over the powers of two up to the devices present
  counts=$(python -c "import jax; print(*[d for d in (1, 2, 4, 8, 16) if d <= jax.device_count()])" 2>/dev/null)
  step scaling 120 python -m benchmarks.scaling --rounds 3 --devices ${counts:-1} --write
fi
step lora_memory 90 python -m benchmarks.lora_memory --write
cp benchmarks/RESULTS.md "$out/RESULTS.md"
echo "budget used: $((SECONDS - t0)) s of ${budget} s; logs and RESULTS.md in $out"
