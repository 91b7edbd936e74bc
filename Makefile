# Two entry points: `make demo` and `make test`. Everything else is plumbing they call.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
# The Estimator suite's venv (TF 2.15; see test-estimator below).
VENV215 := .venv-tf215
PY215 := $(VENV215)/bin/python
STAMP215 := $(VENV215)/.installed

.PHONY: demo demo-detection bench check test test-skips venv lint pytest pytest-bazel bazel-setup bazel-test clean sandbox

venv: $(STAMP)

# Re-install only when the dependency pins or the package metadata change.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# beam: serving-opt compare and its tests (tests/compare/test_compare.py); text: TF Text ops
	@# for serving-opt serve, as TF Serving links them (tests/model_server/test_server_flags.py); dask:
	@# compare on Beam's DaskRunner; kfp: the KFP component (tests/integrations/test_kfp_component.py).
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,beam,dask,kfp,text]'
	@touch $(STAMP)
	@# Bazel < 7.1 cannot watch the venv: re-list its packages so cached test results of
	@# the previous venv are not reused (tools/bazel/venv_python.bzl).
	@if command -v bazel >/dev/null 2>&1 && [ -f .bazelrc.offline ]; then \
	  bazel sync --only=serving_opt_venv_python --noshow_progress >/dev/null 2>&1 || true; fi

# bubblewrap: every process that runs a model runs in its sandbox (serving_opt/sandbox/).
SANDBOX_STAMP := $(VENV)/.installed-bwrap
$(SANDBOX_STAMP): $(STAMP)
	@command -v bwrap >/dev/null 2>&1 || { \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y bubblewrap; }
	@touch $(SANDBOX_STAMP)

sandbox: $(SANDBOX_STAMP)

# The sample is built once; optimizing it again replaces version 1 (--overwrite).
demo: $(STAMP) $(SANDBOX_STAMP)
	@$(PY) -m serving_opt.samples --kind=classifier --output_dir=build/sample/1
	@echo; echo "== serving-opt inspect build/sample/1"
	@$(VENV)/bin/serving-opt inspect --saved_model_dir=build/sample/1
	@echo; echo "== serving-opt optimize --validate build/sample/1 -> build/models/classifier"
	@$(VENV)/bin/serving-opt optimize --input_dir=build/sample/1 \
	  --output_base=build/models/classifier --version=1 --overwrite \
	  --validate --server=auto --write_warmup --duration=3 \
	  --report=build/report/optimize.json
	@echo; echo "JSON report: build/report/optimize.json (marker: build/report/VALIDATED)"

# The detection case: an OD-API-shaped frozen_inference_graph.pb in, folded, proven by
# the detection parity rule, served over gRPC and REST, published with its .pb.
demo-detection: $(STAMP) $(SANDBOX_STAMP)
	@$(PY) -m serving_opt.detection.sample --output_dir=build/detection \
	  --write_frames=build/detection/frames.jsonl
	@echo; echo "== serving-opt inspect build/detection/frozen_inference_graph.pb"
	@$(VENV)/bin/serving-opt inspect --saved_model_dir=build/detection/frozen_inference_graph.pb
	@echo; echo "== serving-opt optimize the .pb -> build/models/detector"
	@$(VENV)/bin/serving-opt optimize \
	  --saved_model_dir=build/detection/frozen_inference_graph.pb \
	  --outputs=detection_boxes,detection_scores,detection_classes,num_detections \
	  --examples=build/detection/frames.jsonl --output_format=graphdef \
	  --model_base_path=build/models/detector --version=1 --overwrite \
	  --validate --server=auto --duration=3 --report=build/report/detector.json
	@echo; echo "== the same, its input pinned to the frames' shape (kept only if faster)"
	@$(VENV)/bin/serving-opt optimize \
	  --saved_model_dir=build/detection/frozen_inference_graph.pb \
	  --outputs=detection_boxes,detection_scores,detection_classes,num_detections \
	  --examples=build/detection/frames.jsonl --input_shapes=image_tensor:1,480,640,3 \
	  --model_base_path=build/models/detector_pinned --version=1 --overwrite \
	  --report=build/report/detector_pinned.json

# The bench's extra (matplotlib, for its chart), on top of the dev install.
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,beam,bench]'
	@touch $(BENCH_STAMP)

# Original vs lossless, int8, fp16 and GTT quantize_weights on the text classifier, wide &
# deep and MobileNetV2, side by side (slow): build/bench/quantize.md and quantize.png.
# Then serving-opt tune on MobileNetV2 and the text classifier: build/bench/tune.md.
bench: $(BENCH_STAMP) $(SANDBOX_STAMP)
	$(PY) benchmarks/compare.py
	$(PY) benchmarks/tune.py
	$(PY) benchmarks/int8_memory.py --rounds=5

# The unit tier: in-process tests of the logic (options, gates, graph rewrites, the static
# check's rules, result decoding, batching and tune decisions, with fakes for servers and
# load), lint first; about a minute on 2 cores. `make test` runs these and everything else.
UNIT_TESTS = $(foreach t,$(UNIT),$(wildcard tests/test_$(t).py tests/*/test_$(t).py))
UNIT := $(strip \
  options entry_points gates gate_early_decision lossy_interval detection_matching \
  detection_parity detection_frozen_graph detection_graph_analysis tune_outputs \
  tune_serving_version tune_fast_decode tune_grid tune_proving model_server_batching \
  model_server_concurrency sandbox_results static_check static_check_bounds \
  static_check_hidden_routes asset_paths dead_functions terminal_escapes inspect load_errors \
  freeze independent_check validate_reference_failures doctests)

check: $(STAMP) lint
	$(PY) -m pytest -q -p no:cacheprovider $(UNIT_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check serving_opt tests examples benchmarks tools
	$(VENV)/bin/lint-imports  # the layering contracts of pyproject.toml ([tool.importlinter])

# Every test file, straight through pytest (what a developer runs while working).
pytest: $(STAMP) $(SANDBOX_STAMP) bazel-setup  # tests/integrations/test_bazel.py calls bazel
	$(PY) -m pytest -q tests

# The whole suite, each test file once: under Bazel, every tests/test_*.py in the shards
# of //tests:suite, the Estimator suite on TF 2.15 (//tests:estimator_suite) and examples/,
# TEST_JOBS at a time; then the tests that drive Bazel itself (they cannot run inside a Bazel test).
# The Docker engine is ours only for the run: stopped after it (if we started it), also
# when a test fails or the run is interrupted.
test: $(STAMP) $(SANDBOX_STAMP) lint docker-image
	@trap '$(if $(DRY_RUN),,tools/docker/engine.sh stop)' EXIT; \
	  $(MAKE) --no-print-directory bazel-test pytest-bazel test-skips

# Every skip of the run above with its reason; a skip that tests/expected_skips.txt does
# not expect fails the run (a skipped test never counts as a pass).
test-skips:
	$(PY) tools/test_skips.py

pytest-bazel: $(STAMP) bazel-setup
	$(PY) -m pytest -q tests/integrations/test_bazel.py --junitxml=build/junit/bazel.xml

# Bazel: Debian's bazel-bootstrap (4.2.3) when none is installed, then the offline
# setup (.bazelrc.offline, gitignored; see tools/bazel/README.md).
bazel-setup:
	@command -v bazel >/dev/null 2>&1 || { \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y bazel-bootstrap bazel-rules-java; }
	@tools/bazel/offline_setup.sh

# Bazel's cache key does not see what the tests run on beside the venv (bubblewrap, the
# TF 2.15 venv, the user, cgroups, Docker): a fingerprint of it as a test env variable
# keeps a cached pass from outliving the setup it ran on.
TEST_ENV_KEY = $(shell { command -v bwrap && bwrap --version; ls $(STAMP215); id -u; \
  cat /proc/self/cgroup; command -v docker; docker info --format '{{.ServerVersion}}'; \
  docker image inspect --format '{{.Id}}' $(CONTRACT_IMAGE); } 2>&1 | sha256sum | cut -c1-16)

# The TF 2.15 venv first: tests/serving/test_validate_runtime.py serves a model under it (the
# stand-in on the production TF Serving's release), and skips where it is absent.
# The suite's shared models (tests/conftest.py model_base) are built afresh in each run.
MODEL_CACHE := $(CURDIR)/build/test-models
# Half again as many test processes as cores: a test often waits (a server starting, a
# sandboxed worker importing TensorFlow, a container), and two at a time left a core idle
# for about a third of the run on 2 cores. (--jobs too: it caps the tests as well.)
TEST_JOBS ?= HOST_CPUS*1.5
bazel-test: $(STAMP) $(STAMP215) $(SANDBOX_STAMP) bazel-setup
	rm -rf $(MODEL_CACHE)
	bazel test //... --test_output=errors --noshow_progress --test_summary=terse \
	  --jobs=$(TEST_JOBS) --local_test_jobs=$(TEST_JOBS) \
	  --test_env=SERVING_OPT_TEST_ENV=$(TEST_ENV_KEY) \
	  --test_env=SERVING_OPT_MODEL_CACHE=$(MODEL_CACHE)

clean:
	rm -rf build

# The Docker engine and the contract image tests/serving/test_docker_engine.py runs (docs/docker.md):
# docker.io installed and dockerd started when none answers (build/docker/dockerd.pid says
# we did; docker-stop stops only that one), the image built once per machine and again
# only when its inputs change (tools/docker/image.sh).
# make -n runs a recipe that calls $(MAKE): its trap must not stop the engine then.
DRY_RUN = $(findstring n,$(firstword -$(MAKEFLAGS)))
CONTRACT_IMAGE := serving-opt/tfs-contract:$(shell sed -n 's/^tensorflow==//p' constraints.txt)
.PHONY: docker-engine docker-image docker-stop
docker-engine:
	@tools/docker/engine.sh start

docker-image: $(STAMP) docker-engine
	@PY=$(PY) CONTRACT_IMAGE=$(CONTRACT_IMAGE) tools/docker/image.sh \
	  || { tools/docker/engine.sh stop; exit 1; }

docker-stop:
	@tools/docker/engine.sh stop

# The Estimator suite (tests/estimator) needs tf.estimator, gone from TF 2.16 on: it runs
# in a second venv with TF 2.15, pinned in constraints-tf215.txt. tensorflow-serving-api
# 2.15 requires the full `tensorflow`, which would install a second TF over tensorflow-cpu,
# so it goes in without dependencies (its real ones, grpcio and protobuf, come with TF).
PIP215 := $(PY215) -m pip install --quiet --disable-pip-version-check -c constraints-tf215.txt

.PHONY: venv-tf215 test-estimator

venv-tf215: $(STAMP215)

$(STAMP215): pyproject.toml constraints-tf215.txt
	@test -x $(PY215) || $(PYTHON) -m venv $(VENV215)
	@# pysimdjson: serving-opt's own dependency (REST decoding), which --no-deps -e . skips.
	$(PIP215) tensorflow-cpu==2.15.1 tensorflow-estimator==2.15.0 pytest pysimdjson
	$(PIP215) --no-deps tensorflow-serving-api==2.15.1
	$(PIP215) --no-deps -e .
	@touch $(STAMP215)

# Also needs .venv: it checks that models optimized under TF 2.21 load under 2.15.
# --confcutdir: the suite has its own fixtures, not the main suite's.
test-estimator: $(STAMP) $(STAMP215) $(SANDBOX_STAMP)
	$(PY215) -m pytest -q --confcutdir=tests/estimator tests/estimator \
	  --junitxml=build/junit/estimator.xml

# Corpus of SavedModels written by real TensorFlow writers (tests/corpus, issue 29).
# One throwaway venv per TensorFlow release that installs here (build/corpus-venvs/tf-2.NN,
# cached by its .stamp); each writes its own models with tools/corpus_writers/write_models.py.
# A release that does not install is recorded (its .failed holds pip's last lines) and
# skipped. old_shapes.py (main venv) then writes the hand-built older-writer shapes, and
# make_manifest.py rebuilds tests/corpus/corpus.json from what is on disk.
CORPUS_TF := 2.12 2.13 2.14 2.15 2.16 2.17 2.18 2.19 2.20 2.21
CORPUS_VENVS := build/corpus-venvs
CORPUS_STAMPS := $(foreach v,$(CORPUS_TF),$(CORPUS_VENVS)/tf-$(v)/.stamp)

.PHONY: corpus-venvs corpus-models

corpus-venvs: $(CORPUS_STAMPS)

$(CORPUS_VENVS)/tf-%/.stamp: tools/corpus_writers/make_venv.sh
	tools/corpus_writers/make_venv.sh $* $(CORPUS_VENVS)/tf-$* $(PYTHON)

corpus-models: $(STAMP) $(CORPUS_STAMPS)
	@for v in $(CORPUS_TF); do \
	  if test -e $(CORPUS_VENVS)/tf-$$v/.installed; then \
	    $(CORPUS_VENVS)/tf-$$v/bin/python tools/corpus_writers/write_models.py \
	      --out tests/corpus/models/tf-$$v || exit 1; \
	  else echo "corpus: TF $$v did not install, skipped: $$(tail -1 $(CORPUS_VENVS)/tf-$$v/.failed)"; fi; \
	done
	$(PY) tools/corpus_writers/old_shapes.py --out tests/corpus/models/handbuilt
	$(PY) tools/corpus_writers/make_manifest.py

# Every corpus model through inspect and optimize (defaults, measuring off) and the
# independent parity check: one line per model and the tally (build/corpus/report.json).
# CORPUS_EXTRA=DIR adds every SavedModel under DIR (exports that cannot be committed here,
# such as TF Serving's own testdata).
.PHONY: corpus
corpus: $(STAMP) $(SANDBOX_STAMP)
	$(PY) tools/corpus_report.py $(if $(CORPUS_EXTRA),--extra_dir=$(CORPUS_EXTRA))
