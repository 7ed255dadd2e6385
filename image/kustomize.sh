#!/usr/bin/env bash
# image/kustomize.sh IMG BASE_DIR OUT_DIR   (make deploy IMG=...)
#
# Writes OUT_DIR/kustomization.yaml: BASE_DIR as its only resource and an
# `images:` entry that points the controller's container (image name
# `my-controller` in the manifests) at IMG, a reference of the form
# registry/name[:tag] or registry/name@sha256:digest. `kubectl apply -k OUT_DIR`
# (or `kubectl kustomize OUT_DIR`) then does the override; the manifests are
# never edited.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 IMG BASE_DIR OUT_DIR" >&2; exit 2; }
img=$1 base=$2 out=$3
[ -d "$base" ] || { echo "$0: $base is not a directory of manifests (set DEPLOY_DIR=)" >&2; exit 2; }
case $img in
    *[[:space:]]*|"") echo "$0: IMG=$img is not an image reference" >&2; exit 2 ;;
esac
if [[ $img == *@* ]]; then
    name=${img%%@*} field="digest: \"${img#*@}\""
elif [[ ${img##*/} == *:* ]]; then          # a colon after the last slash is a tag,
    name=${img%:*} field="newTag: \"${img##*:}\""   # one before it a registry port
else
    name=$img field=""
fi
mkdir -p "$out"
base_rel=$(realpath --relative-to="$out" "$base")
{
    echo "# Written by image/kustomize.sh (make deploy IMG=$img); not to be edited."
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources:"
    echo "- $base_rel"
    echo "images:"
    echo "- name: my-controller"
    echo "  newName: \"$name\""
    [ -z "$field" ] || echo "  $field"
} > "$out/kustomization.yaml"
echo "# $out/kustomization.yaml: $base_rel with my-controller -> $img" >&2
