"""Rebuilds tests/corpus/corpus.json from the SavedModels under tests/corpus/models (issue 29).

Run with the project's TensorFlow (.venv, TF 2.21): every model is also loaded there, once
with the TF1 session loader (tf.compat.v1.saved_model.loader.load) and, when it has a TF2
object graph, with tf.saved_model.load; a model that does not load keeps its entry, with
`loads_tf2_21: false` and the error in `notes`.

Each group directory (models/<group>/) has a WRITER.json written by the script that made
its models (tools/corpus_writers/write_models.py or old_shapes.py), or a PROVENANCE.json
for models copied from elsewhere: {"source": ..., "license": ..., "kind": ...,
"models": {name: {"writer": ..., "notes": ...}}}.

Manifest entry (the contract with the corpus runner):
  id, path (relative to tests/corpus), tf_version, writer, kind, source, license,
  signatures (serve tag, without __saved_model_init_op), notes,
  plus: tags, size_bytes, loads_tf2_21, has_object_graph.
"""

import argparse
import json
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import saved_model_pb2  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "corpus"))
WRITERS = {"write_models": "written by tools/corpus_writers/write_models.py",
           "old_shapes": "written by tools/corpus_writers/old_shapes.py"}
OWN_LICENSE = "Apache-2.0"


def dir_size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def serve_meta_graph(sm):
    for mg in sm.meta_graphs:
        if "serve" in mg.meta_info_def.tags:
            return mg
    return sm.meta_graphs[0]


def check_load(path, mg):
    """Returns None if the model loads under this TF, else a one-line error."""
    errors = []
    graph = tf.Graph()
    try:
        with tf.compat.v1.Session(graph=graph) as sess:
            tf.compat.v1.saved_model.loader.load(sess, list(mg.meta_info_def.tags), path)
    except Exception as e:  # noqa: BLE001  (recorded in the manifest)
        errors.append(f"session loader: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")
    if len(mg.object_graph_def.nodes) > 1:
        try:
            tf.saved_model.load(path, tags=list(mg.meta_info_def.tags))
        except Exception as e:  # noqa: BLE001
            first = str(e).strip().splitlines()[0][:300]
            errors.append(f"tf.saved_model.load: {type(e).__name__}: {first}")
    return "; ".join(errors) or None


def group_info(group_dir):
    for name in ("WRITER.json", "PROVENANCE.json"):
        p = os.path.join(group_dir, name)
        if os.path.exists(p):
            with open(p) as f:
                return name, json.load(f)
    return None, {}


def entries(corpus, check):
    out = []
    models_dir = os.path.join(corpus, "models")
    for group in sorted(os.listdir(models_dir)):
        group_dir = os.path.join(models_dir, group)
        if not os.path.isdir(group_dir):
            continue
        info_name, info = group_info(group_dir)
        for root, dirs, files in sorted(os.walk(group_dir)):
            dirs.sort()
            if "saved_model.pb" not in files:
                continue
            rel = os.path.relpath(root, corpus)
            name = os.path.relpath(root, group_dir)
            sm = saved_model_pb2.SavedModel()
            with open(os.path.join(root, "saved_model.pb"), "rb") as f:
                sm.ParseFromString(f.read())
            mg = serve_meta_graph(sm)
            model_info = info.get("models", {}).get(name.split(os.sep)[0], {})
            if isinstance(model_info, str):
                model_info = {"writer": model_info}
            written_by = mg.meta_info_def.tensorflow_version
            if info_name == "WRITER.json" and group.startswith("tf-"):
                kind, source = name, WRITERS["write_models"]
                tf_version = info.get("versions", {}).get("tensorflow", written_by)
            elif info_name == "WRITER.json":
                kind, source = "handbuilt", WRITERS["old_shapes"]
                tf_version = written_by
            else:
                kind = info.get("kind", group)
                source = info.get("source", "")
                tf_version = written_by
            notes = model_info.get("notes", "")
            if info_name == "WRITER.json" and group.startswith("tf-"):
                versions = info.get("versions", {})
                extra = ", ".join(
                    f"{k} {versions[k]}" for k in ("keras", "tf_keras") if k in versions)
                notes = "; ".join(x for x in (notes, f"venv had {extra}" if extra else "") if x)
            error = check_load(root, mg) if check else None
            if error:
                failed = f"does not load in TF {tf.__version__}: {error}"
                notes = "; ".join(x for x in (notes, failed) if x)
            out.append({
                "id": f"{group}/{name}",
                "path": rel,
                "tf_version": tf_version,
                "writer": model_info.get("writer", ""),
                "kind": kind,
                "source": source,
                "license": info.get("license", OWN_LICENSE),
                "signatures": sorted(k for k in mg.signature_def if k != "__saved_model_init_op"),
                "notes": notes,
                "tags": list(mg.meta_info_def.tags),
                "size_bytes": dir_size(root),
                "has_object_graph": len(mg.object_graph_def.nodes) > 1,
                "loads_tf2_21": error is None if check else None,
            })
            print(f"{out[-1]['id']}: {out[-1]['size_bytes']} bytes, "
                  f"{'loads' if not error else 'DOES NOT LOAD: ' + error}", flush=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default=CORPUS)
    parser.add_argument("--noload", action="store_true", help="skip the load check")
    args = parser.parse_args()
    try:
        manifest = entries(args.corpus, not args.noload)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
    with open(os.path.join(args.corpus, "corpus.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"{len(manifest)} models -> {os.path.join(args.corpus, 'corpus.json')}")


if __name__ == "__main__":
    main()
