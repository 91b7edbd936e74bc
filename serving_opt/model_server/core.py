"""ServerCore: which versions are loaded, their states, and who may use them.

One manager thread does what TF Serving's file-system source, AspiredVersionsManager and
AvailabilityPreservingPolicy do together:

* every ``file_system_poll_wait_seconds`` it lists each model's base path and decides
  the aspired versions (storage_path.py);
* it then acts one step at a time, like ``AvailabilityPreservingPolicy::GetNextAction``:
  unload a no-longer-aspired version once an aspired one is AVAILABLE (so a model never
  goes dark during a version switch), else load the highest new aspired version;
* a load is Servable.load + warmup, retried ``max_num_load_retries`` times
  ``load_retry_interval_micros`` apart; a version that still fails ends in END with its
  error, and the previous version keeps serving.

Version states (START, LOADING, AVAILABLE, UNLOADING, END) are kept per model, END
included, for GetModelStatus. Requests take a handle on an AVAILABLE version; an unload
waits for in-flight handles before closing the session.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc

from serving_opt.model_server import model_config, storage_path
from serving_opt.model_server.request_options import RequestOptions
from serving_opt.model_server.servable import LoadOptions, Servable, ServableId
from serving_opt.model_server.status import (
    ServingStatusError,
    failed_precondition,
    from_tf_error,
    invalid_argument,
    not_found,
    unknown,
)
from serving_opt.model_server.warmup import replay_warmup

log = logging.getLogger("serving_opt.model_server")


class State(enum.IntEnum):
    """``ModelVersionStatus.State`` numbers, as GetModelStatus reports them."""

    START = 10
    LOADING = 20
    AVAILABLE = 30
    UNLOADING = 40
    END = 50


@dataclass(frozen=True)
class VersionStatus:
    """One version's last state and error (None: OK)."""

    version: int
    state: State
    error: ServingStatusError | None = None


@dataclass(frozen=True)
class CoreOptions:
    """Loading and polling behaviour; defaults are tensorflow_model_server's.

    ``file_system_poll_wait_seconds``: 0 polls once, negative never polls.
    ``load_retry_interval_micros``: negative retries without waiting.
    """

    load_options: LoadOptions = field(default_factory=LoadOptions)
    file_system_poll_wait_seconds: float = 1
    enable_model_warmup: bool = True
    num_request_iterations_for_warmup: int = 1
    max_num_load_retries: int = 5
    load_retry_interval_micros: int = 60_000_000
    allow_version_labels_for_unavailable_models: bool = False
    # Any label may point at any version, loaded or not, even moving an existing label.
    force_allow_any_version_labels_for_unavailable_models: bool = False
    signature_method_name_check: bool = False
    batching: Any = None  # a batching.BatchingOptions: wrap every session for batching


class ServableHandle(NamedTuple):
    """What a request gets: the version it runs on and the loaded servable."""

    id: ServableId
    servable: Servable


class _Harness:
    """A managed version (C++ LoaderHarness): state, aspiration and users in flight."""

    def __init__(self, servable_id: ServableId, path: str) -> None:
        self.id = servable_id
        self.path = path
        self.state = State.START
        self.aspired = True
        self.error: ServingStatusError | None = None
        self.servable: Servable | None = None
        self.users = 0


def servable_request_text(name: str, version: int | None) -> str:
    """C++ ``ServableRequest::DebugString``, quoted in NOT_FOUND errors."""
    return f"Latest({name})" if version is None else f"Specific({name}, {version})"


class ServerCore:
    """Models, their versions and the manager thread; see the module docstring."""

    def __init__(self, options: CoreOptions) -> None:
        self.options = options
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._config = None
        self._models: dict[str, object] = {}  # name -> ModelConfig proto
        self._labels: dict[str, dict[str, int]] = {}
        self._harnesses: dict[str, dict[int, _Harness]] = {}
        # Last published state of every version ever seen, with an event sequence number
        # so a waiter can ignore states from before it started waiting.
        self._states: dict[str, dict[int, tuple[VersionStatus, int]]] = {}
        self._sequence = itertools.count(1)
        self._last_sequence = 0
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._polled_once = False
        self._thread = threading.Thread(
            target=self._manage, name="serving-opt-model-manager", daemon=True
        )
        self._thread_started = False
        self.batch_scheduler = None
        if options.batching is not None:
            from serving_opt.model_server.batching import BatchScheduler

            self.batch_scheduler = BatchScheduler(options.batching)

    # ----------------------------------------------------------------- configuration

    def reload_config(self, config, timeout: float | None = None) -> None:
        """Serves exactly the models of ``config`` (a ModelServerConfig proto).

        Blocks until every *new* model has a version AVAILABLE, like ServerCore::ReloadConfig;
        raises ServingStatusError if one ends in END instead (or ``timeout`` passes).
        """
        model_config.validate(config)
        with self._lock:
            if self._stopping.is_set():
                raise failed_precondition("the server is shutting down")
            old = self._config
            if old is not None and old.WhichOneof("config") and config.WhichOneof("config"):
                if old.WhichOneof("config") != "model_config_list":
                    raise failed_precondition(
                        "Cannot transition to requested config. It is only legal to "
                        "transition from one ModelConfigList to another."
                    )
                new_platforms = {m.name: m for m in model_config.model_configs(config)}
                for old_model in model_config.model_configs(old):
                    new_model = new_platforms.get(old_model.name)
                    if new_model is None:
                        continue
                    old_platform = model_config.platform_of(old_model)
                    new_platform = model_config.platform_of(new_model)
                    if old_platform != new_platform:
                        raise invalid_argument(
                            "Illegal to change a model's platform. For model "
                            f"{old_model.name} platform was {old_platform} and new platform "
                            f"requested is {new_platform}"
                        )
            if config.WhichOneof("config") is None:
                log.info("Taking no action for empty config.")
                return
            self._config = config
            self._update_labels(config)
            new_models = {m.name: m for m in model_config.model_configs(config)}
            added = sorted(set(new_models) - set(self._models))
            for removed in set(self._models) - set(new_models):
                # Un-aspire every version: the manager unloads them one by one.
                for harness in self._harnesses.get(removed, {}).values():
                    harness.aspired = False
            self._models = new_models
            start = self._last_sequence
        if not self._thread_started:
            self._thread_started = True
            self._thread.start()
        self._wake.set()
        self._wait_until_available(added, start, timeout)

    def _update_labels(self, config) -> None:
        # C++ UpdateModelVersionLabelMap: a label may only point at an AVAILABLE version
        # unless --allow_version_labels_for_unavailable_models (then only new labels may).
        new_labels: dict[str, dict[str, int]] = {}
        for model in model_config.model_configs(config):
            states = self._states.get(model.name, {})
            for label, version in model.version_labels.items():
                allowed = self.options.force_allow_any_version_labels_for_unavailable_models
                if not allowed and self.options.allow_version_labels_for_unavailable_models:
                    existing = self._labels.get(model.name, {}).get(label)
                    allowed = existing is None or existing == version
                entry = states.get(version)
                available = entry is not None and entry[0].state == State.AVAILABLE
                if not allowed and not available:
                    raise failed_precondition(
                        f"Request to assign label to version {version} of model "
                        f"{model.name}, which is not currently available for inference"
                    )
                new_labels.setdefault(model.name, {})[label] = version
        self._labels = new_labels

    def _wait_until_available(self, names, start: int, timeout: float | None) -> None:
        # C++ WaitUntilModelsAvailable: per model, the highest version whose state changed
        # since `start` and is AVAILABLE or END decides; END fails the whole reload.
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                reached: dict[str, VersionStatus] = {}
                for name in names:
                    for version in sorted(self._states.get(name, {}), reverse=True):
                        status, sequence = self._states[name][version]
                        if sequence > start and status.state in (State.AVAILABLE, State.END):
                            reached[name] = status
                            break
                if len(reached) == len(names):
                    break
                if self._stopping.is_set():
                    raise unknown("the server was stopped while models were loading")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    waiting = ", ".join(sorted(set(names) - set(reached)))
                    raise ServingStatusError(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"model(s) {waiting} did not become available within {timeout:g} s",
                    )
                self._changed.wait(remaining if remaining is not None else 1.0)
        failed = {n: s for n, s in reached.items() if s.state != State.AVAILABLE}
        if failed:
            parts = []
            for name, status in sorted(failed.items()):
                why = f" due to error: {status.error.to_text()}" if status.error else ""
                parts.append(f"{{{ServableId(name, status.version)}{why}}}, ")
            raise unknown(
                f"{len(failed)} model(s) did not become available: {{{''.join(parts)}}}"
            )

    # ------------------------------------------------------------------ state monitor

    def _publish(self, harness: _Harness, state: State, error=None) -> None:
        with self._changed:
            harness.state = state
            harness.error = error
            self._last_sequence = next(self._sequence)
            self._states.setdefault(harness.id.name, {})[harness.id.version] = (
                VersionStatus(harness.id.version, state, error),
                self._last_sequence,
            )
            self._changed.notify_all()

    def version_statuses(self, name: str) -> list[VersionStatus]:
        """Every version ever seen of ``name``, highest first (GetModelStatus order)."""
        with self._lock:
            versions = self._states.get(name, {})
            return [versions[v][0] for v in sorted(versions, reverse=True)]

    def model_names(self) -> list[str]:
        """Names of the configured models."""
        with self._lock:
            return sorted(self._models)

    def available_versions(self, name: str) -> list[int]:
        """Versions of ``name`` that requests can use now, ascending."""
        with self._lock:
            return sorted(
                v for v, h in self._harnesses.get(name, {}).items() if h.state == State.AVAILABLE
            )

    # ------------------------------------------------------------------ request side

    def resolve(self, model_spec) -> tuple[str, int | None]:
        """ModelSpec -> (name, version or None for latest), per ServableRequestFromModelSpec."""
        if not model_spec.name:
            raise invalid_argument("ModelSpec has no name specified.")
        choice = model_spec.WhichOneof("version_choice")
        if choice == "version":
            return model_spec.name, model_spec.version.value
        if choice == "version_label":
            with self._lock:
                version = self._labels.get(model_spec.name, {}).get(model_spec.version_label)
            if version is None:
                raise invalid_argument(
                    f"Unrecognized servable version label: {model_spec.version_label}"
                )
            return model_spec.name, version
        return model_spec.name, None

    @contextlib.contextmanager
    def servable_handle(self, model_spec) -> Iterator[ServableHandle]:
        """Holds an AVAILABLE version for the duration of one request.

        Raises NOT_FOUND "Servable not found for request: Latest(m)" / "Specific(m, 3)".
        """
        name, version = self.resolve(model_spec)
        with self._lock:
            available = {
                v: h
                for v, h in self._harnesses.get(name, {}).items()
                if h.state == State.AVAILABLE
            }
            key = max(available) if version is None and available else version
            harness = available.get(key)
            if harness is None:
                raise not_found(
                    f"Servable not found for request: {servable_request_text(name, version)}"
                )
            harness.users += 1
        try:
            yield ServableHandle(harness.id, harness.servable)
        finally:
            with self._changed:
                harness.users -= 1
                if harness.users == 0:
                    self._changed.notify_all()

    # --------------------------------------------------------------- manager thread

    def _manage(self) -> None:
        poll_wait = self.options.file_system_poll_wait_seconds
        while not self._stopping.is_set():
            if poll_wait >= 0:
                self._poll()
            try:
                self._act_until_idle()
            except Exception:  # noqa: BLE001 - the manager must outlive one bad step
                log.exception("model manager step failed")
            # Periodic polling, or (wait <= 0) only when a config reload wakes us.
            self._wake.wait(poll_wait if poll_wait > 0 else None)
            self._wake.clear()

    def _poll(self) -> None:
        with self._lock:
            models = dict(self._models)
        found: dict[str, list[storage_path.AspiredVersion]] = {}
        try:
            for name, model in models.items():
                found[name] = storage_path.aspired_versions(
                    name, model.base_path, model.model_version_policy
                )
        except ServingStatusError as e:
            # As in C++, one unreadable base path aborts the whole poll.
            log.error(
                "FileSystemStoragePathSource encountered a filesystem access error: %s",
                e.message,
            )
            return
        except OSError as e:
            log.error("FileSystemStoragePathSource encountered a filesystem access error: %s", e)
            return
        with self._lock:
            for name, versions in found.items():
                if name not in self._models:
                    continue  # removed by a concurrent reload
                self._set_aspired(name, versions)

    def _set_aspired(self, name: str, versions: list[storage_path.AspiredVersion]) -> None:
        harnesses = self._harnesses.setdefault(name, {})
        wanted = {v.version: v.path for v in versions}
        for version, harness in list(harnesses.items()):
            harness.aspired = version in wanted
            # A finished (END) version that is no longer aspired leaves the manager; if it
            # reappears later it is loaded afresh. One that is still aspired is not retried.
            if harness.state == State.END and not harness.aspired:
                del harnesses[version]
        for version, path in wanted.items():
            if version not in harnesses:
                harness = _Harness(ServableId(name, version), path)
                harnesses[version] = harness
                self._publish(harness, State.START)

    def _next_action(self, name: str) -> tuple[str, _Harness] | None:
        # AvailabilityPreservingPolicy::GetNextAction, verbatim in spirit.
        harnesses = list(self._harnesses.get(name, {}).values())
        has_aspired = any(h.aspired for h in harnesses)
        has_aspired_serving = any(h.aspired and h.state == State.AVAILABLE for h in harnesses)
        unaspired_serving = [
            h for h in harnesses if not h.aspired and h.state == State.AVAILABLE
        ]
        if unaspired_serving and (
            not has_aspired or has_aspired_serving or len(unaspired_serving) > 1
        ):
            return "unload", min(unaspired_serving, key=lambda h: h.id.version)
        new = [h for h in harnesses if h.aspired and h.state == State.START]
        if new:
            return "load", max(new, key=lambda h: h.id.version)
        return None

    def _act_until_idle(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                action = None
                for name in sorted(self._harnesses):
                    action = self._next_action(name)
                    if action is not None:
                        break
            if action is None:
                return
            kind, harness = action
            if kind == "load":
                self._load(harness)
            else:
                self._unload(harness)

    def _load_once(self, harness: _Harness) -> Servable:
        load_options = self.options.load_options
        if load_options.prefer_tflite_model:
            from serving_opt.model_server import tflite

            if tflite.tflite_model_exists(harness.path):
                servable = tflite.TfLiteServable.load(harness.id, harness.path,
                                                      load_options.tflite_interpreters,
                                                      load_options.allow_file_ops)
            else:
                servable = Servable.load(harness.id, harness.path, load_options)
        else:
            servable = Servable.load(harness.id, harness.path, load_options)
        try:
            if self.batch_scheduler is not None:
                # Before warmup, as upstream: warmup runs through the batching session.
                servable.enable_batching(self.batch_scheduler)
            if self.options.enable_model_warmup:
                replay_warmup(
                    servable,
                    RequestOptions(
                        signature_method_name_check=self.options.signature_method_name_check
                    ),
                    self.options.num_request_iterations_for_warmup,
                )
        except BaseException:
            servable.close()
            raise
        return servable

    def _load_with_retries(
        self, harness: _Harness
    ) -> tuple[Servable | None, ServingStatusError | None]:
        # C++ Retry(): max_num_load_retries more attempts after the first, stopped early
        # when the version is no longer aspired or the server stops.
        attempt = 0
        while True:
            try:
                return self._load_once(harness), None
            except Exception as e:  # noqa: BLE001 - every load failure becomes a status
                error = from_tf_error(e)
            log.error("Loading servable: %s failed: %s", harness.id, error.to_text())
            attempt += 1
            if attempt > self.options.max_num_load_retries:
                return None, error
            interval = self.options.load_retry_interval_micros / 1e6
            if interval > 0 and self._stopping.wait(interval):
                return None, error
            self._poll()
            if not harness.aspired or self._stopping.is_set():
                log.info("Retrying of Loading servable: %s was cancelled.", harness.id)
                return None, error
            log.info("Retrying of Loading servable: %s retry: %d", harness.id, attempt)

    def _load(self, harness: _Harness) -> None:
        self._publish(harness, State.LOADING)
        log.info("Loading servable version %s", harness.id)
        servable, error = self._load_with_retries(harness)
        if servable is None:
            self._publish(harness, State.END, error)
            return
        if not harness.aspired or self._stopping.is_set():
            servable.close()
            cancelled = ServingStatusError(
                grpc.StatusCode.CANCELLED, "Loading of servable cancelled"
            )
            self._publish(harness, State.END, cancelled)
            return
        with self._lock:
            harness.servable = servable
        self._publish(harness, State.AVAILABLE)
        log.info("Successfully loaded servable version %s", harness.id)

    def _unload(self, harness: _Harness) -> None:
        self._publish(harness, State.UNLOADING)
        with self._changed:
            # New requests no longer see it (not AVAILABLE); wait for those in flight.
            while harness.users:
                self._changed.wait()
            servable, harness.servable = harness.servable, None
        if servable is not None:
            servable.close()
        self._publish(harness, State.END)
        with self._lock:
            versions = self._harnesses.get(harness.id.name, {})
            if not harness.aspired and versions.get(harness.id.version) is harness:
                del versions[harness.id.version]
        log.info("Done unloading servable version %s", harness.id)

    # ------------------------------------------------------------------------ shutdown

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stops polling and closes every loaded session (waits for requests in flight)."""
        self._stopping.set()
        self._wake.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread_started:
            self._thread.join(timeout)
        with self._changed:
            harnesses = [h for hs in self._harnesses.values() for h in hs.values()]
            deadline = None if timeout is None else time.monotonic() + timeout
            while any(h.users for h in harnesses):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._changed.wait(remaining)
            to_close = [h for h in harnesses if h.servable is not None]
            for harness in to_close:
                harness.servable, servable = None, harness.servable
                harness.state = State.END
                servable.close()
        if self.batch_scheduler is not None:
            self.batch_scheduler.stop()
