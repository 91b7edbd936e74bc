"""Ops that touch files or the host: the data behind the untrusted-model stance.

A SavedModel is code. These ops, reachable from a signature, make a run of the model
read or write files, execute Python, talk to the network or end the process, on
whatever machine runs it: the build host during ``optimize`` (freezing, parity,
benchmark) and ``validate``. :mod:`serving_opt.untrusted` finds them; ``inspect``
rates them as risks; the transforms and Grappler never constant-fold them.

How the list was made (TensorFlow 2.21, 1910 registered ops): every OpDef of the
registry (``TF_GetAllOpList``) was selected whose name matched
``File|Read|Write|Save|Restore|Checkpoint|Summary|Record|Reader|Debug|PyFunc|Immutable|
Sql|LMDB|Snapshot|Rpc|Matching|Load|Print|Abort|TextLine|FixedLength|CSV|Cache|Event|
Dump|Proto|Remap|DataService|Host|System`` or that has an input or attr named like
``file|path|dir|pattern|logdir|dump|prefix|url|stream|descriptor`` (316 ops); each was
then reviewed by hand against its kernel's documentation. Left out: ops that only
name files without touching them (``ShardedFilename``, ``StaticRegex*``), summaries
that only serialize a proto (``ScalarSummary``, ``MergeSummary``), ``Reader*`` ops
that act on a reader resource (the reader op itself is listed), TPU/XLA host
transfer ops (they need a TPU system, and move tensors, not files), ``Print`` (writes
to stderr only) and test ops. ``tests/test_untrusted_models.py`` checks that every
op named here is registered. Re-run the selection when TensorFlow is upgraded.
"""

from __future__ import annotations

RUNS_CODE = "runs Python code"
WRITES_FILES = "writes files"
READS_FILES = "reads files"
TOUCHES_HOST = "touches the host (network, process, filesystem configuration)"

HOST_OPS: dict[str, str] = {
    # Python: arbitrary code.
    "PyFunc": RUNS_CODE,
    "PyFuncStateless": RUNS_CODE,
    "EagerPyFunc": RUNS_CODE,
    # Files written.
    "WriteFile": WRITES_FILES,
    "Save": WRITES_FILES,
    "SaveV2": WRITES_FILES,
    "SaveSlices": WRITES_FILES,
    "MergeV2Checkpoints": WRITES_FILES,  # also deletes the merged shards
    "DatasetToTFRecord": WRITES_FILES,
    "ExperimentalDatasetToTFRecord": WRITES_FILES,
    "SaveDataset": WRITES_FILES,
    "SaveDatasetV2": WRITES_FILES,
    "DistributedSave": WRITES_FILES,
    "SnapshotDataset": WRITES_FILES,  # writes the snapshot, or reads it back
    "SnapshotDatasetV2": WRITES_FILES,
    "CacheDataset": WRITES_FILES,  # a non-empty filename caches to files
    "CacheDatasetV2": WRITES_FILES,
    "CreateSummaryFileWriter": WRITES_FILES,
    "CreateSummaryDbWriter": WRITES_FILES,
    "WriteSummary": WRITES_FILES,
    "WriteScalarSummary": WRITES_FILES,
    "WriteHistogramSummary": WRITES_FILES,
    "WriteImageSummary": WRITES_FILES,
    "WriteAudioSummary": WRITES_FILES,
    "WriteGraphSummary": WRITES_FILES,
    "WriteRawProtoSummary": WRITES_FILES,
    "ImportEvent": WRITES_FILES,
    "FlushSummaryWriter": WRITES_FILES,
    "CloseSummaryWriter": WRITES_FILES,
    "StatsAggregatorSetSummaryWriter": WRITES_FILES,
    "DumpTensor": WRITES_FILES,
    "CalibrationStatisticsSaver": WRITES_FILES,
    # tfdbg ops: their debug_urls (file://, grpc://) receive the tensors.
    "DebugIdentity": WRITES_FILES,
    "DebugIdentityV2": WRITES_FILES,
    "DebugIdentityV3": WRITES_FILES,
    "DebugNanCount": WRITES_FILES,
    "DebugNumericSummary": WRITES_FILES,
    # Files read, listed or mapped.
    "ReadFile": READS_FILES,
    "MatchingFiles": READS_FILES,
    "MatchingFilesDataset": READS_FILES,
    "ExperimentalMatchingFilesDataset": READS_FILES,
    "ImmutableConst": READS_FILES,
    "Restore": READS_FILES,
    "RestoreV2": READS_FILES,
    "RestoreSlice": READS_FILES,
    "DTensorRestoreV2": READS_FILES,
    "LoadAndRemapMatrix": READS_FILES,
    "GenerateVocabRemapping": READS_FILES,
    "InitializeTableFromTextFile": READS_FILES,
    "InitializeTableFromTextFileV2": READS_FILES,
    "Skipgram": READS_FILES,
    "RecordInput": READS_FILES,
    "WholeFileReader": READS_FILES,
    "WholeFileReaderV2": READS_FILES,
    "TextLineReader": READS_FILES,
    "TextLineReaderV2": READS_FILES,
    "TFRecordReader": READS_FILES,
    "TFRecordReaderV2": READS_FILES,
    "FixedLengthRecordReader": READS_FILES,
    "FixedLengthRecordReaderV2": READS_FILES,
    "LMDBReader": READS_FILES,
    "TFRecordDataset": READS_FILES,
    "TFRecordDatasetV2": READS_FILES,
    "TextLineDataset": READS_FILES,
    "FixedLengthRecordDataset": READS_FILES,
    "FixedLengthRecordDatasetV2": READS_FILES,
    "CSVDataset": READS_FILES,
    "CSVDatasetV2": READS_FILES,
    "ExperimentalCSVDataset": READS_FILES,
    "LMDBDataset": READS_FILES,
    "ExperimentalLMDBDataset": READS_FILES,
    "SqlDataset": READS_FILES,
    "ExperimentalSqlDataset": READS_FILES,
    "LoadDataset": READS_FILES,
    "ListSnapshotChunksDataset": READS_FILES,
    "SnapshotChunkDataset": READS_FILES,
    "SnapshotDatasetReader": READS_FILES,
    # The host itself.
    "Abort": TOUCHES_HOST,  # ends the process
    "FileSystemSetConfiguration": TOUCHES_HOST,
    "RpcServer": TOUCHES_HOST,
    "RpcServerStart": TOUCHES_HOST,
    "RpcServerRegister": TOUCHES_HOST,
    "RpcClient": TOUCHES_HOST,
    "RpcCall": TOUCHES_HOST,
    "DataServiceDataset": TOUCHES_HOST,
    "DataServiceDatasetV2": TOUCHES_HOST,
    "DataServiceDatasetV3": TOUCHES_HOST,
    "DataServiceDatasetV4": TOUCHES_HOST,
}

# Ops that touch the host only with some attribute values: op -> (attr, what it does).
# PrintV2 writes to stderr/stdout/the log, or to a file for ``file://`` streams; the
# proto codecs read a descriptor file unless the source is the built-in pool; the
# sampler reads its vocabulary file when one is named.
CONDITIONAL_HOST_OPS: dict[str, tuple[str, str]] = {
    "PrintV2": ("output_stream", WRITES_FILES),
    "DecodeProtoV2": ("descriptor_source", READS_FILES),
    "EncodeProto": ("descriptor_source", READS_FILES),
    "FixedUnigramCandidateSampler": ("vocab_file", READS_FILES),
}

# The checkpoint ops the loader's own saver runs (SaverDef restore/save).
CHECKPOINT_OPS = frozenset({
    "Save", "SaveV2", "SaveSlices", "MergeV2Checkpoints", "Restore", "RestoreV2",
    "RestoreSlice",
})
TABLE_FROM_FILE_OPS = frozenset({"InitializeTableFromTextFile", "InitializeTableFromTextFileV2"})


def host_op_kind(node) -> str | None:
    """What ``node`` (a NodeDef) does to the host, or None when it is harmless.

    Example:
        >>> host_op_kind(node_def_pb2.NodeDef(name="w", op="WriteFile"))
        'writes files'
    """
    kind = HOST_OPS.get(node.op)
    if kind is not None:
        return kind
    conditional = CONDITIONAL_HOST_OPS.get(node.op)
    if conditional is None:
        return None
    attr, kind = conditional
    value = node.attr[attr].s.decode("utf-8", "replace") if attr in node.attr else ""
    if node.op == "PrintV2":
        return kind if value.startswith("file://") else None
    if node.op in ("DecodeProtoV2", "EncodeProto"):
        return kind if value not in ("", "local://") else None
    return kind if value else None


def all_listed_ops() -> frozenset[str]:
    """Every op type named by this module (the registry test checks each exists)."""
    return frozenset(HOST_OPS) | frozenset(CONDITIONAL_HOST_OPS)
