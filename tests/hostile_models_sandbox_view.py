"""Hostile SavedModels that probe the sandbox's view and what is published.

Each builder writes ``<target_dir>/<route>/1`` and returns it. The init op (the main op
every loader runs after restoring) assigns what the model reads to a string variable
that a signature output returns: freezing folds the variable, so whatever the sandbox
let the model read ends up in the published ``saved_model.pb``.

Example:
    >>> build_init_op_reads(str(tmp_path), "/proc/self/environ")
    '.../init_op_reads/1'
"""

from __future__ import annotations

import os
import textwrap

import tensorflow as tf
from saved_model_io import save_tf1, serving_default

# Starts 300 threads and prints how many it started, then holds for argv[1] seconds
# (none given: exits at once): what a sandbox's thread limit must stop.
SPAWN_300_THREADS = textwrap.dedent("""
    import sys, threading, time
    threading.stack_size(1 << 16)
    started = 0
    try:
        for _ in range(300):
            threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
            started += 1
    except RuntimeError:
        pass
    print(started, flush=True)
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
""")

v1 = tf.compat.v1


def _leaking_model(export_dir: str, read) -> str:
    """``y = x * w`` and ``leak``: a string variable the main op assigns ``read()`` to."""
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        w = v1.get_variable("w", initializer=tf.constant([1.0, 2.0, 3.0]), use_resource=True)
        # Not in the checkpoint (the saver has w only): only the main op gives it a value.
        # A vector: TF's freezing fails on a scalar string variable.
        leak = v1.get_variable("leak", initializer=tf.constant(["nothing read"]),
                               use_resource=True)
        y = tf.identity(x * w, name="y")
        seen = tf.tile(leak.read_value(), tf.shape(x)[:1], name="seen")
        with tf.control_dependencies([leak.initializer]):
            main_op = tf.group(leak.assign(tf.reshape(read(), [1])), name="main_op")
        return save_tf1(graph, export_dir,
                        serving_default({"x": x}, {"y": y, "seen": seen}), main_op=main_op,
                        saver=v1.train.Saver([w]))


def build_init_op_reads(target_dir: str, path: str, route: str = "init_op_reads") -> str:
    """The init op reads the file ``path`` (``/proc/self/environ``, ``/proc/self/status``,
    ``/proc/sys/kernel/hostname``, ``/proc/self/mountinfo``, a host file)."""
    return _leaking_model(os.path.join(target_dir, route, "1"),
                          lambda: tf.io.read_file(path))


def build_init_op_lists(target_dir: str, pattern: str) -> str:
    """The init op lists ``pattern`` (MatchingFiles): the names of what the sandbox shows
    in a directory, joined."""
    return _leaking_model(os.path.join(target_dir, "init_op_lists", "1"),
                          lambda: tf.strings.reduce_join(tf.io.matching_files(pattern),
                                                         separator="\n"))


def build_init_op_blocks(target_dir: str) -> str:
    """The init op dequeues from a queue nobody fills: loading never returns."""
    def dequeue():
        queue = tf.queue.FIFOQueue(1, [tf.string], shapes=[[]], name="never_filled")
        return queue.dequeue()

    return _leaking_model(os.path.join(target_dir, "init_op_blocks", "1"), dequeue)


def build_request_plants(target_dir: str, pattern: str, contents: str) -> str:
    """Every request writes ``planted.txt`` into each directory ``pattern`` matches (the
    run's candidates, found by listing the work directory) and into its variables/, and
    a warmup file nobody asked for into its assets.extra/."""
    export_dir = os.path.join(target_dir, "request_plants", "1")
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        w = v1.get_variable("w", initializer=tf.constant([1.0, 2.0, 3.0]), use_resource=True)
        found = tf.io.matching_files(pattern)
        names = tf.concat([found + "/planted.txt", found + "/variables/planted.txt",
                           found + "/assets.extra/tf_serving_warmup_requests"], 0)

        def write(name):
            with tf.control_dependencies([tf.io.write_file(name, contents)]):
                return tf.identity(name)

        planted = tf.map_fn(write, names, fn_output_signature=tf.string)
        with tf.control_dependencies([planted]):
            y = tf.identity(x * w, name="y")
        return save_tf1(graph, export_dir, serving_default({"x": x}, {"y": y}))
