# Stage timing for .ci/run (sourced). Each stage prints its duration; a stage
# that runs past its allowance prints a warning naming it (not a failure:
# machines differ), so that growth shows the day it happens. The allowances
# and the figures they come from are in docs/testing.md ("CI budget").
#
#   ci_stage NAME ALLOWANCE_SECONDS COMMAND [ARGS...]
#   ci_summary   # the table of every stage run, and the total
#
# A stage that fails stops CI (set -e) after printing how long it ran.

ci_stage_rows=()
ci_started=$SECONDS

ci_format_seconds() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

ci_stage() {
  local name="$1" allowance="$2"
  shift 2
  printf '\n\033[1m== CI stage %s (allowance %s)\033[0m\n' "$name" "$(ci_format_seconds "$allowance")" >&2
  local start=$SECONDS status=0
  "$@" || status=$?
  local took=$((SECONDS - start))
  local verdict="ok"
  if ((status != 0)); then
    verdict="FAILED (exit $status)"
  elif ((took > allowance)); then
    verdict="OVER its allowance of $(ci_format_seconds "$allowance")"
    printf '\033[1;33mCI WARNING: stage %s took %s, past its allowance of %s (docs/testing.md, "CI budget")\033[0m\n' \
      "$name" "$(ci_format_seconds "$took")" "$(ci_format_seconds "$allowance")" >&2
  fi
  ci_stage_rows+=("$(printf '%-16s %8s  %s' "$name" "$(ci_format_seconds "$took")" "$verdict")")
  printf '\033[1m== CI stage %s: %s, %s\033[0m\n' "$name" "$(ci_format_seconds "$took")" "$verdict" >&2
  if ((status != 0)); then
    ci_summary
    return "$status"
  fi
}

ci_summary() {
  printf '\n== CI stages\n' >&2
  printf '%s\n' "${ci_stage_rows[@]}" >&2
  printf '%-16s %8s\n' "total" "$(ci_format_seconds $((SECONDS - ci_started)))" >&2
}
