#!/usr/bin/env bash
# Builds the throwaway venv that writes tests/corpus/models/tf-2.NN (issue 29).
# usage: make_venv.sh 2.NN DIR [PYTHON]
# Always exits 0 so one TensorFlow that does not install does not stop the others:
# DIR/.installed on success (with `pip freeze` in DIR/freeze.txt), DIR/.failed with the
# tail of pip's log otherwise. DIR/.stamp marks that this version was tried.
set -u
minor="$1"; dir="$2"; py="${3:-python3}"
mkdir -p "$dir"
rm -f "$dir/.installed" "$dir/.failed"
log="$dir/install.log"
pip_() { "$dir/bin/python" -m pip install --disable-pip-version-check --progress-bar off "$@" >>"$log" 2>&1; }
: >"$log"
if ! { test -x "$dir/bin/python" || "$py" -m venv "$dir" >>"$log" 2>&1; }; then
  tail -20 "$log" >"$dir/.failed"; touch "$dir/.stamp"; exit 0
fi
pkgs=("tensorflow-cpu==${minor}.*")
case "$minor" in
  2.1[6-9]|2.2[0-9]) pkgs+=("tf-keras==${minor}.*") ;;  # Keras 2 beside the bundled Keras 3
esac
if pip_ "${pkgs[@]}"; then
  "$dir/bin/python" -m pip freeze >"$dir/freeze.txt" 2>/dev/null
  touch "$dir/.installed"
else
  # tf-keras of this minor may not exist: try TensorFlow alone before giving up.
  if [ "${#pkgs[@]}" -gt 1 ] && pip_ "tensorflow-cpu==${minor}.*"; then
    echo "tf-keras==${minor}.* did not install; Keras 2 models skipped" >"$dir/.partial"
    "$dir/bin/python" -m pip freeze >"$dir/freeze.txt" 2>/dev/null
    touch "$dir/.installed"
  else
    tail -20 "$log" >"$dir/.failed"
  fi
fi
touch "$dir/.stamp"
exit 0
