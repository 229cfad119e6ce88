#!/usr/bin/env bash
# The GPU runbook: stages, each one command that ends well inside the lent machine's 10 minutes, idempotent and
# resumable. Run on the GPU machine from the repository root, with .whl (bash scripts/gpu/fetch_wheels.sh) and
# gpu-results/ (the files earlier stages returned, copied back; may be empty) carried along:
#
#   bash scripts/gpu/runbook.sh STAGE [STAGE ...]        e.g.  bash scripts/gpu/runbook.sh env tiny
#
# stages, with the time each took on one H100 (2026-11-23; a machine's start, 1-2 min, not included):
#   env           versions, GPU memory, toolchain (one line per problem), `plan --host auto`'s figure for
#                 TinyLlama full/LoRA and OpenLLaMA 7B LoRA (to set beside this machine's implied host time per op),
#                 then pytest -m gpu                                                                 5 min
#   tiny          lab Part 1 TinyLlama rows s1-s5, s10 (random weights, benchmark data)            6 min
#                 (6.7 min on an H200, 2026-11-27, s1 included: it fits 141 GB)
#                 + the collector's overhead (plain litgpt vs tunelab run, 3 pairs)              + 3.5 min
#   profile       torch.profiler summary of TinyLlama full and LoRA steps                          0.5 min
#   grid          the same profile over GRID ("model:micro ...", default TinyLlama at micro 1, 4, 16 and
#                 OpenLLaMA 3B at 1, 4; a row "model:micro:lora" runs one method, "model:micro:lora,qlora" two
#                 (qlora: litgpt's bnb.nf4), "model:micro:full:32-true" at fp32 with TF32 matmuls,
#                 "model:micro:full:bf16-mixed" under autocast over fp32 weights), full and LoRA
#                 by default, with the host's clock per phase and its speed per op
#                 -> profile-grid.jsonl: the time model's out-of-sample rows (tunelab/plan/model/kernels.py;
#                 reports/planner-accuracy/kernels.md); about 25 s a row on an H200 (2026-11-27)      2.5 min
#   qlora-memory  QLoRA vs LoRA memory by phase: 8 TinyLlama rows 3.5 min, 8 OpenLLaMA 7B rows
#                 ~50 s each (7B checkpoint built once, ~1 min)                                   ~11 min: 2 calls
#   qlora-time    TinyLlama QLoRA and LoRA in litgpt's loop, micro 4 x 4, 16 steps (configs/sweeps/qlora-time.yaml):
#                 the step time QLoRA adds where the host bounds it                         2.2 min on an H200
#   fsdp1-lora    LoRA under FSDP1 beside FSDP2 on one GPU, tunelab's loop (configs/sweeps/fsdp1-lora.yaml: TinyLlama
#                 and OpenLLaMA 7B, micro 4 x 4, 16 steps): the frozen weights' gradients FSDP1 computes, in the step
#                 time and the peak (planned before any GPU ran it: the sweep file's header)    (not yet timed) est. 6 min
#   mid           lab Part 1 OpenLLaMA 3B and 7B rows: s6, s11, s7, s12, s13; on an H200 (2026-11-27): s6, s7,
#                 s11 and most of s12 in 9.4 min (both checkpoints built), s12 again 2.9 min, s13 not run
#                 (s13 was 183 s on the lab's A100)                                                  ~14 min: 2 calls
#   alloc         why OpenLLaMA 7B LoRA's loop took twice its isolated step (2026-11-27): lab Part 1 rows ALLOC_ROWS
#                 (default s12; "s11 s12" adds 3B LoRA, whose loop did not) again, each record counting its steady
#                 window's cudaMalloc/cudaFree calls -> lab-part1-alloc.tgz, then the same under
#                 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -> lab-part1-expandable.tgz (not yet timed; s12
#                 took 173 s on an H200 and its random 7B checkpoint about 80 s to build, once per arm)
#                                                                                      est. 9 min; 13 with s11
#   big           lab Part 1 OpenLLaMA 13B rows: s8, s9, s14 (26 GB checkpoint; not yet timed)  est. 8-10 min
#   part3         the FSDP tuning tables (docs/lab.md, Part 3): tunelab tune-study lab-part3, study
#                 PART3 (default tiny-llama-1.1b-full: TinyLlama full, bf16-mixed, FSDP, one GPU); 33 probes
#                 took 3 calls (~21 min) on the H100; a cut search goes on where it stopped    ~20 min: 3 calls
#   bench         litgpt against tunelab's fast path (tunelab bench, PAIRS (default 3) alternating pairs of
#                 STEPS (default 30) optimizer steps at the lab's s4 baseline (bf16-true, micro 8, global 32), then
#                 each at its best micro batch unless BEST_MICRO=0): BENCH recipes in turn (default TinyLlama full,
#                 TinyLlama LoRA, OpenLLaMA 7B LoRA) on GPU (default H100-SXM); records reused by the next call.
#                 TinyLlama full: pairs 2 calls, its best-micro search a third, unfinished (2026-11-25);
#                 LoRA, BEST_MICRO=0 PAIRS=2 STEPS=20 on an H200 (2026-11-26): TinyLlama 4 min (cold compile 75 s),
#                 OpenLLaMA 7B about 3.5 min a pair (the 7B checkpoint built once, loaded by each run)
#                                                                                    est. 40 min: 4 calls/recipe
#   families      the planner across families (configs/sweeps/families-gpu.yaml: Gemma 2B and Phi-2 LoRA,
#                 Llama 3.2 1B full and LoRA, Mistral 7B QLoRA; micro 2 and 4; random weights) (not yet timed)
#                                                                                               est. 10-15 min: 2 calls
#   history       what is alive at the peak: one LoRA run each of HISTORY (default TinyLlama and Llama 3.2 1B,
#                 micro 4, 2 steps) under TUNELAB_MEMORY_HISTORY=1 -> history.tgz (stats/memory-rank0.json)
#                                                                                       (not yet timed) est. 3 min
#   overhead      the collector's overhead to 1%: TinyLlama full bf16-true at OVERHEAD_MICRO (default 16; set it
#                 to the bench stage's best micro batch), 30 steps, alternating pairs until the median ratio's 95%
#                 interval is within +-1% (at most 40 pairs, BUDGET) -> collector-overhead.json (not yet timed)
#   wrapper-host  FSDP's wrapper host work per unit on this machine's CPU, in ops of the plain loop, and the plain
#                 loop's time per op there (scripts/bench_wrapper_host.py, 5 reps; CPU only) -> wrapper-host.json,
#                 beside the loop's own time per op in this machine's records; then validation's and decode's
#                 share of a training op's host time (scripts/bench_eval_host.py) -> eval-host.json  est. 8 min
# A stage cut by BUDGET goes on where it stopped at the next call (same command, gpu-results/ carried).
#
# Every stage writes into $OUT (what comes back: at most 8 files, whatever the stages): <sweep>.tgz (every record
# and log of that sweep, earlier stages' rows included, no weights, and its report under <sweep>/report/, all
# rewritten after EVERY row), runbook.log, collector-overhead.json, profile.md. A command killed at its limit still
# returns the rows it finished. Copy the .tgz files back into gpu-results/ before the next call: rows already
# recorded there are not run again. The report: `tunelab report runs/gpu/<sweep>` here, or the one in the archive.
#
# BUDGET (seconds, default 540) bounds the whole command: no row starts after it, a row still running then is
# killed and runs again at the next call. TUNELAB_REHEARSAL=1 rehearses the same stages on a CPU machine with
# the tiny model (`pytest -m slow tests/e2e/test_gpu_runbook.py` does, 3 minutes: run it before a GPU session).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT: the folder whose files come back}"
# the variables a person sets: whole numbers are whole numbers (bash's arithmetic would evaluate anything else,
# a command substitution included), folders are not empty
for var in BUDGET PAIRS STEPS OVERHEAD_MICRO BEST_MICRO TUNELAB_REHEARSAL; do
  if [ -n "${!var+set}" ] && ! [[ ${!var} =~ ^[0-9]{1,9}$ ]]; then
    echo "runbook: $var=${!var@Q}: not a whole number; fix: digits only (BUDGET=540, PAIRS=3), or leave it unset" >&2; exit 2
  fi
done
for var in RESULTS RUNS; do
  if [ -n "${!var+set}" ] && [ -z "${!var// /}" ]; then
    echo "runbook: $var is empty; fix: a folder under the checkout, or leave it unset" >&2; exit 2
  fi
done
RESULTS=${RESULTS:-gpu-results}
RUNS=${RUNS:-runs/gpu}
BUDGET=${BUDGET:-540}
REHEARSAL=${TUNELAB_REHEARSAL:-0}
PY=${PYTHON:-python3}   # the interpreter with torch (the GPU image's python3; a venv's python in the rehearsal)
export PYTHONUNBUFFERED=1 JSONARGPARSE_DEPRECATION_WARNINGS=off
mkdir -p "$OUT" "$RUNS"

left() { echo $(( BUDGET - SECONDS )); }

# 1. the carried wheels (the GPU image has no litgpt, jsonargparse, bitsandbytes, deepspeed, pydantic)
if [ -d .whl ] && ! "$PY" -c "import litgpt" 2>/dev/null; then
  SITE=${SITE:-/tmp/tunelab-site}
  rm -rf "$SITE"  # a fresh target: pip --target never removes what an earlier, different set left there
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || { echo "runbook: installing the carried wheels failed"; exit 2; }
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# 2. earlier results: unpack every archive that came back, so finished rows are skipped (resume)
for tgz in "$RESULTS"/*.tgz; do
  [ -f "$tgz" ] && tar xzf "$tgz" -C "$RUNS" --skip-old-files 2>/dev/null
done

if [ "$REHEARSAL" = 1 ]; then
  MODEL=(--model tiny); FAST=(--set train.max_steps=3 --set data.num_workers=0 --set eval.max_iters=2)
else
  MODEL=(--weights random); FAST=()
fi

sweep() {  # sweep NAME ROWS... : the rows of configs/sweeps/NAME.yaml, report + archive after every row
  local name=$1; shift            # (SWEEP_AS=DIR: recorded under DIR and DIR.tgz, apart from NAME's own records)
  local as=${SWEEP_AS:-$name}
  if [[ ! $as =~ ^[A-Za-z0-9_-][A-Za-z0-9._-]*$ ]]; then  # a folder under RUNS and an archive in OUT, nowhere else
    echo "runbook: SWEEP_AS '$as' is not a folder name; fix: letters, digits, '.', '_', '-' (not starting with '.')"
    return 2
  fi
  local prune=(); [ "$name:${1:-}" = "lab-part1:s1" ] || prune=(--prune-checkpoints)  # TinyLlama's is reused next
  local only; only=$(IFS=,; echo "$*")
  echo "runbook: tunelab sweep configs/sweeps/$name.yaml ${MODEL[*]} ${FAST[*]}${only:+ --only $only}"
  "$PY" -m tunelab sweep "configs/sweeps/$name.yaml" "${MODEL[@]}" "${FAST[@]}" ${only:+--only "$only"} \
    --out "$RUNS/$as" --report-dir "$RUNS/$as/report" --report-each-row --archive "$OUT/$as.tgz" \
    "${prune[@]}" --deadline "$(left)"
}

archive() {  # archive DIR FILE.tgz: DIR's records and logs, no weights (tunelab.run.sweep.archive)
  "$PY" -c "import sys; from pathlib import Path; from tunelab.run.sweep import archive; archive(Path(sys.argv[1]), Path(sys.argv[2]))" "$1" "$2"
}

stage_env() {
  "$PY" -m tunelab.run.preflight || return 1
  "$PY" - <<'PY'
import torch
if torch.cuda.is_available():
    free, total = torch.cuda.mem_get_info()
    print(f"CUDA: {torch.cuda.get_device_name(0)}, mem_get_info total {total:,} B ({total / 2**30:.2f} GiB), "
          f"free with this context {free:,} B; context + driver reserve {total - free:,} B")
from tunelab.run.gpu_monitor import cpu_name, device_op_us, host_op_us
launch = device_op_us()
print(f"host: {cpu_name()}; eager dispatch {host_op_us():.2f} us per op"
      + (f", {launch:.2f} us with its launch on GPU 0" if launch else "") + " (what a host-bound step follows)")
if launch:  # `plan --host auto`'s figure (in runbook.log), beside the host time per op this machine's runs imply
    from tunelab.plan.recipe import plan_recipe
    from tunelab.plan.trace.host_probe import measure_here
    from tunelab.recipes import resolve
    for key in ("tiny-llama-1.1b/full", "tiny-llama-1.1b/lora", "open-llama-7b/lora"):
        for precision in ("32-true", "bf16-true"):
            probe = measure_here(plan_recipe(resolve(key), [f"--precision={precision}"], gpu=None).input)
            print(f"--host auto, {key} {precision}: {probe.source()}")
PY
  if [ "$REHEARSAL" = 1 ]; then
    echo "rehearsal: pytest -m gpu needs a CUDA GPU; collecting only"
    "$PY" -m pytest -q -m gpu --collect-only -q tests | tail -3
  else
    timeout "$(( $(left) > 330 ? 300 : $(left) - 30 ))" "$PY" -m pytest -q -m gpu -p no:cacheprovider tests
  fi
}

stage_tiny() {
  sweep lab-part1 s1 s2 s3 s4 s5 s10
  if [ "$(left)" -gt 120 ]; then
    if [ "$REHEARSAL" = 1 ]; then
      "$PY" scripts/bench_collector_overhead.py --pairs 1 --steps 4 --micro 8 --model tiny \
        --json-out "$OUT/collector-overhead.json"
    else
      "$PY" scripts/bench_collector_overhead.py --pairs 3 --steps 30 --micro 8 --precision bf16-true \
        --model random --json-out "$OUT/collector-overhead.json"
    fi
  else
    echo "collector overhead: not run, $(left) s left"
  fi
}

stage_part3() {  # tunelab tune-study: probes under $RUNS/lab-part3/<study>/<setting>/, archive + report after
  local opts=(--weights random --timeout 240)
  [ "$REHEARSAL" = 1 ] && opts=(--model tiny --max-micro 2)
  local rc=0
  timeout -s INT "$(left)" "$PY" -m tunelab tune-study configs/sweeps/lab-part3.yaml --only "${PART3:-tiny-llama-1.1b-full}" \
    --out "$RUNS/lab-part3" --no-report "${opts[@]}" || rc=$?
  "$PY" -m tunelab report "$RUNS/lab-part3" --out "$RUNS/lab-part3/report" || rc=$?
  archive "$RUNS/lab-part3" "$OUT/lab-part3.tgz"
  return $rc
}
stage_bench() {  # tunelab bench per recipe of BENCH; every run a record under $RUNS/bench/<recipe>/, archived after
  local best=(--best-micro); [ "${BEST_MICRO:-1}" = 0 ] && best=()
  local opts=(--weights random --pairs "${PAIRS:-3}" "${best[@]}" --gpu "${GPU:-H100-SXM}" --train.max_steps "${STEPS:-30}" --timeout 300)
  local recipes=${BENCH:-tiny-llama-1.1b/full tiny-llama-1.1b/lora open-llama-7b/lora}
  if [ "$REHEARSAL" = 1 ]; then  # the tiny model stands in for every recipe: one is enough
    opts=(--model tiny --pairs 1 --train.max_steps 4 --data.num_workers 0); recipes=${BENCH:-tiny-llama-1.1b/full}
  fi
  local rc=0 recipe slug base
  for recipe in $recipes; do
    if [ "$(left)" -le 90 ]; then echo "bench $recipe: not started, $(left) s of the budget left"; continue; fi
    slug=${recipe//\//-}
    # every recipe at the baseline the speed goal names: the lab's s4 (bf16-true, micro 8, global 32)
    base=(--precision bf16-true --train.micro_batch_size 8 --train.global_batch_size 32)
    echo "runbook: tunelab bench $recipe ${opts[*]} ${base[*]}"
    timeout -s INT "$(left)" "$PY" -m tunelab bench "$recipe" "${opts[@]}" "${base[@]}" --deadline "$(( $(left) - 60 ))" \
      --out "$RUNS/bench/$slug" --report-dir "$RUNS/bench/$slug/report" || rc=$?
  done
  archive "$RUNS/bench" "$OUT/bench.tgz"
  return $rc
}
stage_qlora-memory() { sweep qlora-memory; }
stage_qlora-time() { sweep qlora-time; }
stage_fsdp1-lora() { sweep fsdp1-lora; }
stage_families() {  # the rehearsal (tiny model, CPU) runs one row per method; QLoRA's is refused there: no CUDA
  if [ "$REHEARSAL" = 1 ]; then sweep families-gpu gemma-2b-lora-mb2 llama-3.2-1b-full-mb2 mistral-7b-qlora-mb2
  else sweep families-gpu; fi
}
stage_history() {  # TUNELAB_MEMORY_HISTORY=1 runs; their records and stats/ (no weights) -> history.tgz
  local models=${HISTORY:-"TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T meta-llama/Llama-3.2-1B"}
  local fast=(); [ "$REHEARSAL" = 1 ] && fast=(--train.max_steps 3 --data.num_workers 0 --eval.max_iters 2)
  local rc=0 model
  for model in $models; do
    if [ "$(left)" -le 90 ]; then echo "history $model: not started, $(left) s of the budget left"; continue; fi
    echo "runbook: TUNELAB_MEMORY_HISTORY=1 tunelab run tiny-llama-1.1b/lora --checkpoint_dir checkpoints/$model"
    TUNELAB_MEMORY_HISTORY=1 timeout -s INT "$(left)" "$PY" -m tunelab run tiny-llama-1.1b/lora "${MODEL[@]}" \
      --checkpoint_dir "checkpoints/$model" --train.max_steps 2 --train.micro_batch_size 4 \
      --eval.final_validation false "${fast[@]}" --out "$RUNS/history/${model##*/}" || rc=$?
  done
  archive "$RUNS/history" "$OUT/history.tgz"
  return $rc
}
stage_overhead() {
  if [ "$REHEARSAL" = 1 ]; then
    "$PY" scripts/bench_collector_overhead.py --pairs 2 --steps 4 --micro 8 --model tiny --target 0.01 \
      --deadline "$(( $(left) - 30 ))" --json-out "$OUT/collector-overhead.json"
  else
    "$PY" scripts/bench_collector_overhead.py --pairs 40 --target 0.01 --steps 30 --micro "${OVERHEAD_MICRO:-16}" \
      --precision bf16-true --model random --deadline "$(( $(left) - 30 ))" --json-out "$OUT/collector-overhead.json"
  fi
}
stage_wrapper-host() {  # host work on this machine's own CPU -> wrapper-host.json, eval-host.json and their .md
  if [ "$REHEARSAL" = 1 ]; then
    "$PY" scripts/bench_wrapper_host.py --reps 1 --iters 3 --warmup 1 --cases litgpt-fsdp1:1 \
      --json-out "$OUT/wrapper-host.json" || return
    "$PY" scripts/bench_eval_host.py --reps 1 --iters 2 --warmup 0 --json-out "$OUT/eval-host.json"
  else
    timeout -s INT "$(( $(left) - 20 ))" "$PY" scripts/bench_wrapper_host.py --reps 5 --json-out "$OUT/wrapper-host.json" \
      || return
    timeout -s INT "$(( $(left) - 20 ))" "$PY" scripts/bench_eval_host.py --reps 5 --json-out "$OUT/eval-host.json"
  fi
}
stage_mid() { sweep lab-part1 s6 s11 s7 s12 s13; }
stage_alloc() {  # litgpt's loop and CUDA's caching allocator: ALLOC_ROWS of lab-part1 (default s12) with the
  local rows=${ALLOC_ROWS:-s12}  # driver calls counted, then again under expandable segments
  SWEEP_AS=lab-part1-alloc sweep lab-part1 $rows || return
  if [ "$(left)" -le 120 ]; then echo "alloc: expandable segments not started, $(left) s left"; return 0; fi
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True SWEEP_AS=lab-part1-expandable sweep lab-part1 $rows
}
stage_big() { sweep lab-part1 s8 s9 s14; }
stage_grid() {  # one JSON line per (model, micro, method); a row already in gpu-results/profile-grid.jsonl is kept
  local grid=${GRID:-"tiny-llama-1.1b:1 tiny-llama-1.1b:4 tiny-llama-1.1b:16 open_llama_3b:1 open_llama_3b:4"}
  local steps=10 rc=0 row
  [ "$REHEARSAL" = 1 ] && { grid=${GRID:-"tiny:1 tiny:2"}; steps=2; }
  [ -f "$RESULTS/profile-grid.jsonl" ] && cp "$RESULTS/profile-grid.jsonl" "$OUT/profile-grid.jsonl"
  for row in $grid; do  # model:micro, model:micro:methods (comma-separated full, lora, qlora; full,lora the
    local model micro methods precision todo="" m  # default), model:micro:methods:precision (bf16-true, 32-true, ...)
    IFS=: read -r model micro methods precision <<< "$row"; methods=${methods:-full,lora}; precision=${precision:-bf16-true}
    for m in ${methods//,/ }; do  # the methods of this row not measured yet
      grep -q "\"model\": \"$model\", \"method\": \"$m\", \"micro\": $micro,.*\"dtype\": \"$precision\"" \
        "$OUT/profile-grid.jsonl" 2>/dev/null || todo=${todo:+$todo,}$m
    done
    if [ -z "$todo" ]; then echo "grid $row: already measured"; continue; fi
    if [ "$(left)" -le 60 ]; then echo "grid $row: not started, $(left) s of the budget left"; continue; fi
    timeout -s INT "$(( $(left) - 20 ))" "$PY" scripts/gpu/profile_steps.py --model "$model" --micro "$micro" \
      --methods "$todo" --precision "$precision" --steps "$steps" --json "$OUT/profile-grid.jsonl" > /dev/null || rc=$?
  done
  return $rc
}
stage_profile() {
  if [ "$REHEARSAL" = 1 ]; then
    "$PY" scripts/gpu/profile_steps.py --model tiny --out "$OUT/profile.md" --steps 2
  else
    "$PY" scripts/gpu/profile_steps.py --out "$OUT/profile.md"
  fi
}

status=0
for stage in "$@"; do
  if ! declare -F "stage_$stage" >/dev/null; then
    echo "runbook: unknown stage '$stage' (env, tiny, qlora-memory, qlora-time, fsdp1-lora, mid, alloc, big, profile, grid, part3, bench, families, history, overhead, wrapper-host)"; exit 2
  fi
  if [ "$(left)" -le 30 ]; then
    echo "runbook: stage $stage not started: $(left) s of the budget left; run it in the next call"; continue
  fi
  echo "=== stage $stage ($(left) s of the budget left) ==="
  "stage_$stage" 2>&1 | tee -a "$OUT/runbook.log"
  rc=${PIPESTATUS[0]}
  echo "=== stage $stage: exit $rc after ${SECONDS} s in all ==="
  [ "$rc" = 0 ] || status=$rc
done
n=$(find "$OUT" -type f | wc -l)
[ "$n" -le 8 ] || echo "runbook: WARNING: $n files in \$OUT, more than the 8 that come back"
ls -la "$OUT"
exit $status
