#!/usr/bin/env bash
# check.sh [--plan] [DIR] — the offline check of a Terraform/OpenTofu
# configuration (infra/gcp by default): "fmt -check -recursive", then
# "validate" against the real google, kubernetes and archive providers, which
# a generated CLI config supplies through dev_overrides, so no registry and no
# network are needed. With --plan it runs DIR's plan tests instead
# ("tofu test": DIR/tests/*.tftest.hcl, command = plan), with the same
# providers. Exits non-zero on the first problem. Nothing is written into DIR.
#
#   TOFU       the tofu (or terraform) binary                 (required)
#   PROVIDERS  space-separated folders, one per provider, each holding its
#              terraform-provider-<name> binary               (required)
set -euo pipefail

plan=false
if [[ ${1:-} == --plan ]]; then
  plan=true
  shift
fi
dir=${1:-$(dirname "$0")}
: "${TOFU:?set TOFU to the tofu binary}"
: "${PROVIDERS:?set PROVIDERS to the provider folders}"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

{
  echo 'provider_installation {'
  echo '  dev_overrides {'
  for p in $PROVIDERS; do
    bin=$(find "$p" -maxdepth 1 -name 'terraform-provider-*' ! -name '*.tmp' -type f | head -n 1)
    [[ -n $bin ]] || { echo "check.sh: no terraform-provider-* binary in $p" >&2; exit 1; }
    name=${bin##*/terraform-provider-}
    echo "    \"hashicorp/$name\" = \"$p\""
  done
  echo '  }'
  echo '  direct {}'
  echo '}'
} >"$tmp/cli.tfrc"

export TF_CLI_CONFIG_FILE=$tmp/cli.tfrc TF_DATA_DIR=$tmp/data TF_IN_AUTOMATION=1
export CHECKPOINT_DISABLE=1 TF_REGISTRY_DISCOVERY_RETRY=0

if $plan; then
  echo "infra-plan: $TOFU test $dir (command = plan; providers: dev_overrides, offline)"
  "$TOFU" -chdir="$dir" test -no-color
  exit
fi

echo "infra-check: $TOFU fmt -check -recursive $dir"
"$TOFU" fmt -check -recursive -diff "$dir"

echo "infra-check: $TOFU validate $dir (providers: dev_overrides, offline)"
# The dev_overrides warning is expected; anything else fails the check.
"$TOFU" -chdir="$dir" validate -no-color
