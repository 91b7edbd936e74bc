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
files=$(git ls-files -co --exclude-standard serving_opt docker/contract tools/docker \
          pyproject.toml constraints.txt | LC_ALL=C sort)
inputs=$({ for f in $files; do if [ -f "$f" ]; then sha256sum "$f"; fi; done;
           docker image inspect --format '{{.Id}}' "$BASE"; } | sha256sum | cut -c1-16)
current=$(docker image inspect --format '{{index .Config.Labels "serving-opt.inputs"}}' \
            "$TAG" 2>/dev/null || true)
if [ "$current" = "$inputs" ]; then
  echo "contract image: $TAG is current (inputs $inputs)"
  exit 0
fi

echo "contract image: building $TAG (inputs $inputs)"
rm -rf "$WHEELS" && mkdir -p "$WHEELS"
"$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
  -w "$WHEELS" . >/dev/null
rm -rf build/lib build/bdist.* # setuptools' own scratch, in the source tree
# The wheels the image installs, from the host's pip cache where it has them.
"$PY" -m pip download --quiet --disable-pip-version-check -c constraints.txt \
  --only-binary=:all: -d "$WHEELS" "$WHEELS"/serving_opt-*.whl \
  2> >(grep -v "^WARNING: Location .* is ignored" >&2)

builder=serving-opt-contract-build-$$
trap 'docker rm -f "$builder" >/dev/null 2>&1 || true; rm -rf "$WHEELS"' EXIT
docker run --name "$builder" --network none \
  -v "$PWD/$WHEELS:/wheels:ro" -v "$PWD/docker/contract:/contract:ro" "$BASE" sh -ec '
    python3 -m venv /opt/serving-opt
    /opt/serving-opt/bin/pip install --quiet --no-index --no-compile --find-links /wheels \
      --disable-pip-version-check serving-opt
    install -m 755 /contract/tensorflow_model_server /contract/tf_serving_entrypoint.sh \
      /usr/bin/
    mkdir -p /models
    rm -rf /root/.cache'
old=$(docker image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
docker commit \
  --change 'ENV MODEL_NAME=model MODEL_BASE_PATH=/models' \
  --change 'EXPOSE 8500 8501' \
  --change 'ENTRYPOINT ["/usr/bin/tf_serving_entrypoint.sh"]' \
  --change "LABEL serving-opt.inputs=$inputs serving-opt.stand-in=true" \
  "$builder" "$TAG" >/dev/null
# The previous build of the tag, now untagged: nothing is left beside the tag.
if [ -n "$old" ] && [ "$old" != "$(docker image inspect --format '{{.Id}}' "$TAG")" ]; then
  docker rmi "$old" >/dev/null 2>&1 || true
fi
echo "contract image: built $TAG ($(docker image inspect --format '{{.Size}}' "$TAG" \
  | awk '{printf "%.0f MB", $1/1e6}'))"
