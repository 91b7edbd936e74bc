#!/bin/bash
# The contract image serving-opt/tfs-contract:<TF release>: TF Serving's image contract
# (tensorflow_model_server on PATH taking upstream's flags, the entrypoint honouring
# MODEL_NAME, MODEL_BASE_PATH and extra arguments, ports 8500/8501, models under
# /models/<name>) with this project's local server and TensorFlow inside. A stand-in for
# testing the Docker path where tensorflow/serving cannot be pulled (docs/docker.md).
#
#   tools/docker/image.sh            # build unless the tag's inputs label is current
#
# No registry is reachable: the base is a Debian 12 root file system (mmdebstrap, built
# once per machine), the wheels are downloaded on the host (pip's cache) and installed
# with --no-index in a container that has no network. `docker run` + `docker commit`
# instead of `docker build`: no build cache and no wheels left in any layer.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
TF_VERSION=$(sed -n 's/^tensorflow==//p' constraints.txt)
TAG=${CONTRACT_IMAGE:-serving-opt/tfs-contract:$TF_VERSION}
BASE=serving-opt/debian-python:bookworm
WHEELS=build/docker/wheels

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  echo "contract image: building the base $BASE (Debian 12 with Python 3, about a minute)"
  mmdebstrap --quiet --variant=apt --include=python3,python3-venv bookworm - \
    | docker import --change 'ENV LANG=C.UTF-8' - "$BASE" >/dev/null
fi

# What the image is made of: the project's sources and pins, these scripts, the base.
# (A listed file may be gone by now: another change in progress; it counts as absent.)
RUNTIME=serving-opt/tfs-runtime:$TF_VERSION

# The image's inputs, as a label: rebuilt only when they change.
label() { docker image inspect --format '{{index .Config.Labels "serving-opt.inputs"}}' "$1" \
            2>/dev/null || true; }
hash_files() { for f in "$@"; do if [ -f "$f" ]; then sha256sum "$f"; fi; done; }
commit() {  # builder container -> tag, with the previous image of that tag removed
  local builder=$1 tag=$2 inputs=$3; shift 3
  local old; old=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
  docker commit "$@" --change "LABEL serving-opt.inputs=$inputs" "$builder" "$tag" >/dev/null
  if [ -n "$old" ] && [ "$old" != "$(docker image inspect --format '{{.Id}}' "$tag")" ]; then
    docker rmi "$old" >/dev/null 2>&1 || true
  fi
}

builder=serving-opt-contract-build-$$
trap 'docker rm -f "$builder" >/dev/null 2>&1 || true; rm -rf "$WHEELS"' EXIT
wheel() {  # this project's wheel (and with "deps", every wheel it needs) into $WHEELS
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  "$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    -w "$WHEELS" . >/dev/null
  rm -rf build/lib build/bdist.*  # setuptools' own scratch, in the source tree
  if [ "${1:-}" = deps ]; then
    "$PY" -m pip download --quiet --disable-pip-version-check -c constraints.txt \
      --only-binary=:all: -d "$WHEELS" "$WHEELS"/serving_opt-*.whl \
      2> >(grep -v "^WARNING: Location .* is ignored" >&2)
  fi
}

# 1. The runtime: Python and every dependency (TensorFlow, gRPC, ...), not this project;
# built once per machine and again only when the pins change (a minute or more).
# (pyproject.toml's [project] table only: its pytest and ruff settings change no wheel.)
project=$("$PY" -c 'import json, tomllib
print(json.dumps(tomllib.load(open("pyproject.toml", "rb"))["project"], sort_keys=True))')
runtime_inputs=$({ echo "$project"; hash_files constraints.txt;
                   docker image inspect --format '{{.Id}}' "$BASE"; } | sha256sum | cut -c1-16)
if [ "$(label "$RUNTIME")" != "$runtime_inputs" ]; then
  echo "contract image: building the runtime $RUNTIME (TensorFlow and the other wheels)"
  wheel deps
  docker run --name "$builder" --network none -v "$PWD/$WHEELS:/wheels:ro" "$BASE" sh -ec '
    python3 -m venv /opt/serving-opt
    /opt/serving-opt/bin/pip install --quiet --no-index --no-compile --find-links /wheels \
      --disable-pip-version-check serving-opt
    /opt/serving-opt/bin/pip uninstall --quiet --yes serving-opt
    rm -rf /root/.cache'
  commit "$builder" "$RUNTIME" "$runtime_inputs"
  docker rm -f "$builder" >/dev/null
fi

# 2. The contract image: the runtime plus this project and upstream's entrypoint; rebuilt
# when a source changes (seconds: one wheel without dependencies).
files=$(git ls-files -co --exclude-standard serving_opt docker/contract tools/docker \
          pyproject.toml constraints.txt | LC_ALL=C sort)
inputs=$({ hash_files $files; docker image inspect --format '{{.Id}}' "$RUNTIME"; } \
           | sha256sum | cut -c1-16)
if [ "$(label "$TAG")" = "$inputs" ]; then
  echo "contract image: $TAG is current (inputs $inputs)"
  exit 0
fi
echo "contract image: building $TAG (inputs $inputs)"
wheel
docker run --name "$builder" --network none \
  -v "$PWD/$WHEELS:/wheels:ro" -v "$PWD/docker/contract:/contract:ro" "$RUNTIME" sh -ec '
    /opt/serving-opt/bin/pip install --quiet --no-index --no-deps --no-compile \
      --disable-pip-version-check /wheels/serving_opt-*.whl
    install -m 755 /contract/tensorflow_model_server /contract/tf_serving_entrypoint.sh \
      /usr/bin/
    mkdir -p /models
    rm -rf /root/.cache'
commit "$builder" "$TAG" "$inputs" \
  --change 'ENV MODEL_NAME=model MODEL_BASE_PATH=/models' \
  --change 'EXPOSE 8500 8501' \
  --change 'ENTRYPOINT ["/usr/bin/tf_serving_entrypoint.sh"]' \
  --change 'LABEL serving-opt.stand-in=true'
echo "contract image: built $TAG ($(docker image inspect --format '{{.Size}}' "$TAG" \
  | awk '{printf "%.0f MB", $1/1e6}'))"
