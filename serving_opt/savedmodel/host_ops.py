"""Ops that touch files or the host: the data behind the untrusted-model stance.

A SavedModel is code. These ops, anywhere in a model (the graph or any library
function), make a run of the model read or write files, execute Python, talk to the
network or act on the process, on whatever machine runs it: the build host during
``optimize`` (freezing, parity, benchmark), ``validate`` and ``compare``, and the
server. :mod:`serving_opt.savedmodel.untrusted` finds them; ``inspect`` rates them as risks; the
transforms and Grappler never constant-fold them.

How the list is made and kept (TensorFlow 2.21: 1910 registered ops; 2.15's 1862 were
checked too). Every OpDef of the C++ registry (``TF_GetAllOpList``, a superset of
``tf.raw_ops``: it also has the ``_``-prefixed internal ops a GraphDef may name) falls
in exactly one class, and ``tests/savedmodel/test_static_check.py`` fails when one does not, so a
TensorFlow upgrade that adds an op stops the build until someone has looked at it:

1. :data:`HOST_OPS` and :data:`CONDITIONAL_HOST_OPS`: reviewed, they touch the host
   (a conditional op's attr may be a placeholder: it counts until the static check
   resolves it through the call sites); :data:`EMBEDDED_GRAPH_OPS` run a graph
   serialized in an input, which the static check parses and checks like the model.
2. *Looks like a host op* (:func:`looks_like_host_op`): a CamelCase word of the name
   is in :data:`SUSPICIOUS_WORDS` (File, Read, Write, Save, Record, Rpc, Send, Recv,
   Collective, Register, Service, Load, Print, ...), or an input or attr name matches
   :data:`SUSPICIOUS_ARGUMENT` (filename, path, url, address, protocol, logdir,
   memory_region_name, debug_urls, ...). Such an op must be in class 1 or named in
   :data:`REVIEWED_NOT_HOST` with the reason it was found harmless (e.g.
   ``ReadVariableOp``, ``ShardedFilename``, ``ScalarSummary``, TPU transfer ops).
   No rule of class 3 can clear it.
3. Pure compute, by rule, for ops that do not look like host ops: a stateless op
   (``OpDef.is_stateful`` false: TF's contract is that its output depends on its
   inputs alone and it has no side effect, which is why Grappler folds and dedupes
   them; the stateless ops that do read files, ``ReadFile``, ``MatchingFiles``,
   ``ImmutableConst``, name the file in an argument and are caught by 2), or a
   stateful op of a reviewed family of :data:`STATEFUL_FAMILIES` (variables, random
   numbers, tables, control flow and calls, tensor arrays and stacks, tf.data
   transformations, TPU/XLA device ops, ...).

Ops left out of class 1 on purpose: ops that only name files without touching them
(``ShardedFilename``, ``StaticRegex*``), summaries that only serialize a proto
(``ScalarSummary``, ``MergeSummary``), ``Print`` (stderr), reader-state ops acting on
a reader resource (the reader ops and ``ReaderRead*`` are listed), local queues,
barriers and staging areas (in-process), TPU/XLA host<->device transfer ops (they
move tensors inside one process and need a TPU or XLA), and test ops. Send/Recv,
collectives and NCCL are listed although TF Serving's in-process session keeps them
local: in a distributed runtime they are the network, and no exported serving model
needs them. Re-run the review (the test says which ops are new) on every TensorFlow
upgrade.
"""

from __future__ import annotations

import re

RUNS_CODE = "runs Python code"
WRITES_FILES = "writes files"
READS_FILES = "reads files"
TOUCHES_HOST = "touches the host (network, process, native code, system configuration)"
RUNS_GRAPH = "runs a graph the static check cannot read"

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
    "DistributedSave": WRITES_FILES,  # and asks a tf.data service over the network
    "SnapshotDataset": WRITES_FILES,  # writes the snapshot, or reads it back
    "SnapshotDatasetV2": WRITES_FILES,
    "CacheDataset": WRITES_FILES,  # a non-empty filename caches to files
    "CacheDatasetV2": WRITES_FILES,
    "SummaryWriter": WRITES_FILES,  # the writer resource the ops below write through
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
    "ImmutableConst": READS_FILES,  # memory_region_name is a file mapped into memory
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
    # The reader ops (a reader resource reading the files a queue names) and the ops
    # that make a reader read.
    "WholeFileReader": READS_FILES,
    "WholeFileReaderV2": READS_FILES,
    "TextLineReader": READS_FILES,
    "TextLineReaderV2": READS_FILES,
    "TFRecordReader": READS_FILES,
    "TFRecordReaderV2": READS_FILES,
    "FixedLengthRecordReader": READS_FILES,
    "FixedLengthRecordReaderV2": READS_FILES,
    "LMDBReader": READS_FILES,
    "IdentityReader": READS_FILES,  # reads no file itself, but runs ReaderRead's machinery
    "IdentityReaderV2": READS_FILES,
    "ReaderRead": READS_FILES,
    "ReaderReadV2": READS_FILES,
    "ReaderReadUpTo": READS_FILES,
    "ReaderReadUpToV2": READS_FILES,
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
    "SnapshotNestedDatasetReader": READS_FILES,
    # The process and the machine.
    "Abort": TOUCHES_HOST,  # ends the process
    "WorkerHeartbeat": TOUCHES_HOST,  # its watchdog can shut the process down
    "FileSystemSetConfiguration": TOUCHES_HOST,
    "XlaCustomCall": TOUCHES_HOST,  # calls a native function chosen by name
    "XlaCustomCallV2": TOUCHES_HOST,
    # TPU system configuration: (re)configures or shuts down the accelerator system.
    "ConfigureDistributedTPU": TOUCHES_HOST,
    "_ConfigureDistributedTPU": TOUCHES_HOST,
    "ConfigureAndInitializeGlobalTPU": TOUCHES_HOST,
    "_InitializeHostForDistributedTPU": TOUCHES_HOST,
    "_WaitForDistributedTPU": TOUCHES_HOST,
    "ShutdownDistributedTPU": TOUCHES_HOST,
    "_ShutdownDistributedTPU": TOUCHES_HOST,
    "ShutdownTPUSystem": TOUCHES_HOST,
    "_DisconnectHostFromDistributedTPUSystem": TOUCHES_HOST,
    "ConfigureTPUEmbedding": TOUCHES_HOST,
    "ConfigureTPUEmbeddingHost": TOUCHES_HOST,
    "ConfigureTPUEmbeddingMemory": TOUCHES_HOST,
    "ConnectTPUEmbeddingHosts": TOUCHES_HOST,
    "CollateTPUEmbeddingMemory": TOUCHES_HOST,
    "FinalizeTPUEmbedding": TOUCHES_HOST,
    "FinalizeTPUEmbeddingV2": TOUCHES_HOST,
    # The network: RPC, the tf.data service, cross-process rendezvous and collectives.
    "RpcServer": TOUCHES_HOST,
    "RpcServerStart": TOUCHES_HOST,
    "RpcServerRegister": TOUCHES_HOST,
    "RpcClient": TOUCHES_HOST,
    "RpcCall": TOUCHES_HOST,
    "RpcCheckStatus": TOUCHES_HOST,
    "RpcGetValue": TOUCHES_HOST,
    "RemoteCall": TOUCHES_HOST,  # runs a function on another task
    "RegisterDataset": TOUCHES_HOST,  # registers a dataset with a dispatcher (gRPC)
    "RegisterDatasetV2": TOUCHES_HOST,
    "DataServiceDataset": TOUCHES_HOST,
    "DataServiceDatasetV2": TOUCHES_HOST,
    "DataServiceDatasetV3": TOUCHES_HOST,
    "DataServiceDatasetV4": TOUCHES_HOST,
    "Send": TOUCHES_HOST,
    "Recv": TOUCHES_HOST,
    "_Send": TOUCHES_HOST,
    "_Recv": TOUCHES_HOST,
    "_HostSend": TOUCHES_HOST,
    "_HostRecv": TOUCHES_HOST,
    "CollectiveAllToAllV2": TOUCHES_HOST,
    "CollectiveAllToAllV3": TOUCHES_HOST,
    "CollectiveAssignGroupV2": TOUCHES_HOST,
    "CollectiveBcastRecv": TOUCHES_HOST,
    "CollectiveBcastRecvV2": TOUCHES_HOST,
    "CollectiveBcastSend": TOUCHES_HOST,
    "CollectiveBcastSendV2": TOUCHES_HOST,
    "CollectiveGather": TOUCHES_HOST,
    "CollectiveGatherV2": TOUCHES_HOST,
    "CollectiveInitializeCommunicator": TOUCHES_HOST,
    "CollectivePermute": TOUCHES_HOST,
    "CollectiveReduce": TOUCHES_HOST,
    "CollectiveReduceScatterV2": TOUCHES_HOST,
    "CollectiveReduceV2": TOUCHES_HOST,
    "CollectiveReduceV3": TOUCHES_HOST,
    "NcclAllReduce": TOUCHES_HOST,
    "NcclBroadcast": TOUCHES_HOST,
    "NcclReduce": TOUCHES_HOST,
    "_NcclBroadcastRecv": TOUCHES_HOST,
    "_NcclBroadcastSend": TOUCHES_HOST,
    "_NcclReduceRecv": TOUCHES_HOST,
    "_NcclReduceSend": TOUCHES_HOST,
}

# Ops that touch the host only with some attribute values: op -> (attr, what it does).
# PrintV2 writes to stderr/stdout/the log, or to a file for ``file://`` streams; the
# proto codecs read a descriptor file unless the source is the built-in pool or the
# descriptors themselves (``bytes://``); the
# sampler reads its vocabulary file when one is named; Copy/CopyHost with a
# debug_ops_spec feed tfdbg's debug ops (file:// or grpc:// URLs).
CONDITIONAL_HOST_OPS: dict[str, tuple[str, str]] = {
    "PrintV2": ("output_stream", WRITES_FILES),
    "DecodeProtoV2": ("descriptor_source", READS_FILES),
    "EncodeProto": ("descriptor_source", READS_FILES),
    "FixedUnigramCandidateSampler": ("vocab_file", READS_FILES),
    "Copy": ("debug_ops_spec", TOUCHES_HOST),
    "CopyHost": ("debug_ops_spec", TOUCHES_HOST),
}

# Ops that run a graph handed to them serialized in a string tensor: op -> the input
# holding the GraphDef. The static check parses that graph when the input is a constant
# and checks it like the model's own (nodes and library, nested embeddings too), and
# refuses the op otherwise; :func:`host_op_kind` always counts them, so a transform
# never folds what they compute. Found by searching the registry's input and attr
# names (graph, function_def, serialized, module, program, computation): the other
# serialized inputs are examples, tensors, sparse tensors, summaries, tree ensembles
# and dataset options (data, not graphs); ``XlaCallModule``/``MlirPassthroughOp``/
# ``_TPUCompileMlir``/``_XlaHostComputeMlir`` hold StableHLO/MLIR modules compiled
# by XLA or a TPU compiler (no file or network op can be expressed there, their
# function attrs are entered like any other).
EMBEDDED_GRAPH_OPS: dict[str, int] = {
    "DatasetFromGraph": 0,  # graph_def: a tf.data graph (DatasetToGraph's output)
    # serialized: an iterator's state (a variant), from which TF 1.x-2.2's
    # IteratorResource::Restore rebuilt the dataset by running the GraphDef it holds
    # (GraphRunner). Never a string constant the check can read: always refused, and
    # no serving model restores an iterator.
    "DeserializeIterator": 1,
}

# The descriptor_source prefix of EncodeProto/DecodeProtoV2 carrying the descriptors.
_DESCRIPTOR_BYTES = "bytes://"

# The checkpoint ops the loader's own saver runs (SaverDef restore/save).
CHECKPOINT_OPS = frozenset({
    "Save", "SaveV2", "SaveSlices", "MergeV2Checkpoints", "Restore", "RestoreV2",
    "RestoreSlice",
})
TABLE_FROM_FILE_OPS = frozenset({"InitializeTableFromTextFile", "InitializeTableFromTextFileV2"})
# Ops that read one file named by one input (op -> that input's index): accepted on
# the loader's path when the name is an asset path the loader feeds.
ASSET_READ_OPS: dict[str, int] = {
    "InitializeTableFromTextFile": 1,
    "InitializeTableFromTextFileV2": 1,
    "ReadFile": 0,
}


def host_op_kind(node) -> str | None:
    """What ``node`` (a NodeDef) does to the host, or None when it is harmless."""
    kind = HOST_OPS.get(node.op)
    if kind is not None:
        return kind
    if node.op in EMBEDDED_GRAPH_OPS:
        return RUNS_GRAPH
    conditional = CONDITIONAL_HOST_OPS.get(node.op)
    if conditional is None:
        return None
    attr, _ = conditional
    if attr not in node.attr:
        return None
    return conditional_kind(node.op, node.attr[attr])


def conditional_kind(op: str, value) -> str | None:
    """What an op of :data:`CONDITIONAL_HOST_OPS` does to the host with ``value`` (an
    AttrValue) as its attr, or None when that value is harmless. An attr placeholder
    (``AttrValue.placeholder``, bound by whoever instantiates the function) counts as
    the host op: only the static check, which resolves it through the call sites,
    may clear it.
    """
    _, kind = CONDITIONAL_HOST_OPS[op]
    if value.placeholder:
        return kind
    if value.list.s:  # Copy's debug_ops_spec: any attached debug op
        return kind
    text = value.s.decode("utf-8", "replace")
    if op == "PrintV2":
        return kind if text.startswith("file://") else None
    if op in ("DecodeProtoV2", "EncodeProto"):
        # descriptors.cc GetDescriptorPool: a registered pool ("local://", the only one
        # TF registers), else the source as a file name, else "bytes://<serialized
        # FileDescriptorSet>" parsed from the attr itself. Tried as a file name first,
        # "bytes://..." names the file system of scheme "bytes", which no TF build
        # registers: that lookup fails before any file is opened.
        if text in ("", "local://") or text.startswith(_DESCRIPTOR_BYTES):
            return None
        return kind
    return kind if text else None


def all_listed_ops() -> frozenset[str]:
    """Every op type named by this module (the registry test checks each exists)."""
    return frozenset(HOST_OPS) | frozenset(CONDITIONAL_HOST_OPS) | frozenset(EMBEDDED_GRAPH_OPS)


# ------------------------------------------------------------------- the registry review

# CamelCase words of an op name that say "file, host or network": such an op is never
# cleared by a family rule (see the module docstring).
SUSPICIOUS_WORDS = frozenset({
    "abort", "address", "callback", "calibration", "checkpoint", "checkpoints",
    "client", "collective", "configuration", "configure", "connect", "csv", "custom",
    "debug", "dequeue", "deserialize", "dir", "directory", "distributed", "dump",
    "enqueue", "env", "event", "exec", "execute", "export", "file", "files",
    "filename", "filesystem", "fingerprint", "grpc", "heartbeat", "host", "immutable",
    "import", "infeed", "line", "lmdb", "load", "matching", "memory", "mmap", "nccl",
    "outfeed", "path", "print", "process", "proto", "py", "read", "reader", "record",
    "recv", "register", "remap", "remote", "restore", "rpc", "save", "saver",
    "send", "serialize", "server", "service", "shell", "shutdown", "skipgram",
    "snapshot", "socket", "sql", "stream", "summary", "system", "text", "url",
    "vocab", "worker", "write", "writer",
})
# Input and attr names that carry a file, a place on the network or a debug sink.
SUSPICIOUS_ARGUMENT = re.compile(
    r"file|path|(^|_)dir($|_)|directory|logdir|url|stream|descriptor|address|protocol|"
    r"host|(^|_)port($|_)|server|memory_region|vocab|ckpt|checkpoint|prefix|pattern|"
    r"dump|target|(^|_)job|(^|_)task|cluster|debug|command|socket", re.IGNORECASE)

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z][a-z]*|[a-z]+|\d+")


def name_words(op: str) -> list[str]:
    """The lower-cased CamelCase words of an op name."""
    return [w.lower() for w in _WORD.findall(op)]


def looks_like_host_op(op_def) -> list[str]:
    """Why ``op_def`` (an OpDef) looks like it could touch the host: its suspicious name
    words and argument names; empty when nothing does.
    """
    why = [w for w in name_words(op_def.name) if w in SUSPICIOUS_WORDS]
    why += [a.name for a in op_def.input_arg if SUSPICIOUS_ARGUMENT.search(a.name)]
    why += [a.name for a in op_def.attr if SUSPICIOUS_ARGUMENT.search(a.name)]
    return why


# Ops that look like host ops (class 2) and were reviewed harmless: (full-match regex
# of op names, why). Narrow on purpose: a new op matching a pattern here is one of the
# family the reason talks about.
REVIEWED_NOT_HOST: tuple[tuple[str, str], ...] = (
    (r"ReadVariableOp|_ReadVariablesOp|ReadVariableXlaSplitND|DisableCopyOnRead|"
     r"RngReadAndSkip|VarHandleOp|_XlaAotOnlyVarHandleOp|AssignVariableXlaConcatND",
     "variable reads and handles (debug_name is a label)"),
    (r"TensorArray(Read|Write)(V2|V3)?", "tensor array element access"),
    (r"(Static)?Regex(FullMatch|Replace)", "regular expressions on strings"),
    # TensorFlow Text, which `serve` loads as TF Serving links it: its models (SentencePiece,
    # fast WordPiece, phrase, BERT normalizer) come as a string attr or a uint8 tensor and
    # its vocabularies as lookup-table resources; no kernel of it opens a file.
    (r"RegexSplitWithOffsets|Sentencepiece(Op|DetokenizeOp|IdToStringOp|StringToIdOp|"
     r"TokenizeOp|TokenizeWithOffsetsOp|VocabSizeOp)|WordpieceTokenizeWithOffsets|"
     r"TFText>(BoiseTagsToOffsets|ByteSplitByOffsets|ByteSplitWithOffsets|"
     r"FastSentencepieceDetokenize|FastSentencepieceTokenize|FastWordpieceDetokenize|"
     r"NgramsStringJoin|OffsetsToBoiseTags|PhraseDetokenize|RoundRobinGenerateMasks|"
     r"RoundRobinTrim|Utf8Binarize|WhitespaceTokenizeWithOffsetsV2)",
     "TensorFlow Text: models and vocabularies arrive as tensors, attrs or tables"),
    (r"ShardedFilename|ShardedFilespec", "format a file name string; open nothing"),
    (r"TFLite_Detection_PostProcess",
     "TFLite's SSD post-processing (box decoding and NMS on tensors), in the registry once "
     "TFLite's converter is imported; opens nothing"),
    (r"(Scalar|Histogram|Image|Audio|Tensor|Merge)Summary(V2)?|"
     r"(Experimental)?StatsAggregatorSummary",
     "serialize a Summary proto in memory (the Write*Summary ops write; listed)"),
    (r"Print", "writes to stderr only (PrintV2 with a file:// stream is listed)"),
    (r"Reader(NumRecordsProduced|NumWorkUnitsCompleted|Reset|RestoreState|"
     r"SerializeState)(V2)?",
     "counters and state of a reader resource, from or to a string; the readers and "
     "ReaderRead* are listed"),
    (r"Serialize(Tensor|Sparse|ManySparse|Iterator)|Deserialize(Sparse|ManySparse)|"
     r"(Experimental)?IteratorGetModelProto|BoostedTrees(Serialize|"
     r"Deserialize)Ensemble|BoostedTreesQuantileStreamResourceDeserialize|"
     r"DatasetToGraph(V2)?",
     "convert between tensors or resources and strings in memory"),
    (r"LookupTable(Export|Import)(V2)?", "copy a lookup table to or from tensors"),
    (r"(Experimental)?(SetStatsAggregator|StatsAggregatorHandle)\w*",
     "tf.data statistics kept in memory"),
    (r"Fingerprint|SdcaFprint|DatasetFingerprint", "hash their input"),
    (r"Decode(CSV|Compressed)|EncodePng|ParseSequenceExample(V2)?|"
     r"ParseSingleSequenceExample|CTCBeamSearchDecoder|ApproxTopK|InTopK(V2)?|"
     r"CudnnRNN\w*|_FusedConv2D|_MklNativeFusedConv2D|_FusedQuantized\w*|"
     r"_QuantizedMatMul|UpdateTaskIdAndGlobalCoreArray|TPUReplicateMetadata|_TPUReplicate|"
     r"_XlaHostComputeMlir|XlaHostCompute|TensorSliceDataset|CheckPinned",
     "compute: the flagged argument is a parameter (compression, direction, "
     "targets, debug_name, host_args, is_files, ...), not a file or a peer"),
    (r"HostConst|_HostCast|_CopyFrom(Gpu|Host)To(Host|Gpu)|_DeviceArg|_DeviceRetval",
     "tensors kept in, or copied to and from, host memory inside the process"),
    (r"(Experimental)?(Anonymous|Dummy|Delete)?MemoryCache|(Anonymous)?Memory"
     r"\w*Cache", "tf.data in-memory cache"),
    (r"(FIFO|PaddingFIFO|Priority|RandomShuffle|Fake)Queue(V2)?|Queue(Close|Dequeue|"
     r"DequeueMany|DequeueUpTo|Enqueue|EnqueueMany|IsClosed|Size)(V2)?|Barrier\w*",
     "in-process queues and barriers (a dequeue can block, it cannot leave the "
     "process)"),
    (r"(Infeed|Outfeed)(Enqueue|Dequeue)\w*|(Dynamic)?EnqueueTPUEmbedding\w*|"
     r"(Load|Retrieve)TPUEmbedding\w*|(Xla)?(Send|Recv)TPUEmbedding\w*|"
     r"XlaRecvTPUEmbedding\w*|XlaSendTPUEmbedding\w*|_Xla(Send|Recv)(From|At)Host(V2)?|"
     r"Xla(SendToHost|RecvFromHost|Send|Recv)|ExecuteTPUEmbeddingPartitioner|"
     r"TPUExecute\w*|IsTPUEmbeddingInitialized",
     "TPU/XLA host<->device transfers inside one process; they need a TPU or XLA"),
    (r"(Stateful)?PartitionedCall|StatelessCase|XlaCallModule",
     "call a library function (which the static check enters)"),
    (r"BoostedTrees(CreateQuantileStreamResource|ExampleDebugOutputs|"
     r"FlushQuantileSummaries|MakeStatsSummary|QuantileStreamResource\w*)|"
     r"IsBoostedTreesQuantileStreamResourceInitialized",
     "boosted trees training state in memory (quantile streams, stats, per-example "
     "debug strings)"),
    (r"Debug(Gradient|GradientRef)Identity|DebugNumericSummaryV2",
     "tfdbg v2 in-graph helpers with no debug_urls: they compute, the Debug*V2/V3 "
     "identity ops that send are listed"),
    (r"DeleteRpcFutureResource", "frees an RPC future; the RPC ops that talk are listed"),
    (r"CustomAggregator", "quantization calibration statistics kept in memory "
     "(CalibrationStatisticsSaver, which writes them, is listed)"),
    (r"Snapshot", "copies a tensor (array_ops.snapshot)"),
    (r"NegTrain|Xlog1py", "compute (word2vec counts; x * log1p(y))"),
    (r"TfLiteSubgraphExecute", "TF 2.15 and older: runs a TFLite subgraph held in a "
     "resource, in process"),
    (r"LoadAllTPUEmbeddingParameters|TpuHandleToProtoKey|"
     r"XlaSparseDenseMatmulCustomCombiner\w*|ConvertToSparseCoreCsrWrappedCooTensor|"
     r"GetMinibatch\w*|GetStatsFromListOfSparseCoreCooTensors|"
     r"SortListOfSparseCoreCooTensors",
     "TPU embedding ops: move tables between host and TPU memory in one process "
     "(vocab_size is a number)"),
)

# Stateful ops that do not look like host ops, reviewed family by family: (full-match
# regex, what the family is). A new stateful op outside them fails the registry test.
STATEFUL_FAMILIES: tuple[tuple[str, str], ...] = (
    (r"(Resource)?(Sparse)?Apply\w+|ResourceScatter\w+|Resource(Gather|GatherNd|"
     r"StridedSliceAssign|CountUpTo)|Assign(Add|Sub)?VariableOp|_?VarHandlesOp|"
     r"Variable(V2)?|VariableShape|TemporaryVariable|DestroyResourceOp|"
     r"VarIsInitializedOp|IsVariableInitialized|ResourceInitializedOp|"
     r"MakeWeakResourceHandle|IsResourceHandleRefCounting|ResourceCreateOp|"
     r"ResourceUsingOp|StubResourceHandleOp|_ParallelConcat\w+",
     "variables and resource handles"),
    (r"\w*Random\w*|\w*CandidateSampler|Multinomial|ParameterizedTruncatedNormal|"
     r"TruncatedNormal|Stateful\w+|RngSkip|NonDeterministicInts|"
     r"SampleDistortedBoundingBox(V2)?|\w*SeedGenerator|StatelessRandomGetAlg|NegTrain",
     "random numbers"),
    (r"(Anonymous)?(Mutable)?(Dense)?HashTable(OfTensors)?(V2)?|"
     r"LookupTable(Find|Insert|Remove|Size)(V2)?|InitializeTable(V2|FromDataset)?",
     "lookup tables (the text-file initializers are listed)"),
    (r"If|While|Case|_If|_While|RiscWhile|XlaIf|XlaWhile|_Arg|_Retval|XlaLaunch|"
     r"_XlaCompile|_XlaRun|_XlaMerge|_XlaCompileMlirPlaceholderProgramKey|"
     r"_TPUCompileMlir|TPUCompile\w*|Assert|CheckNumerics(V2)?",
     "control flow, calls and checks (their functions are entered by the check)"),
    (r"Stack(V2|CloseV2|PopV2|PushV2)?|TensorArray\w*|(Ordered)?Map(Clear|"
     r"IncompleteSize|Peek|Size|Stage|Unstage|UnstageNoKey)|Stage(Clear|Peek|Size)?|"
     r"Unstage|\w*Accumulator\w*|Mutex(V2|Lock)|ConsumeMutexLock|"
     r"(Add|AddMany|TakeMany)Sparse(To|From)TensorsMap|GetSessionHandle(V2)?|"
     r"GetSessionTensor|DeleteSessionTensor|_ScopedAllocator\w*|DeepCopy|Empty",
     "in-process data structures"),
    (r"\w*Dataset(V\d)?|Dataset\w+|\w*Iterator\w*|Iterator|ThreadPoolHandle|"
     r"DummyIterationCounter|GlobalShuffle\w*|\w*ThreadPool\w*",
     "tf.data over tensors and other datasets (the file datasets are listed)"),
    (r"TPU\w*|_TPU\w*|\w*TPUEmbedding\w*|_SetGlobalTPUArray|DTensorSetGlobalTPUArray|"
     r"AllToAll|CrossReplicaSum|Xla\w+|ComputeDedup\w+|ConvertTo\w*CooTensor\w*|"
     r"GetMinibatch\w+|StoreMinibatchStatisticsInFdo|GlobalIterId|"
     r"GetTpuTaskId|SortListOfSparseCoreCooTensors|GetStatsFromListOfSparseCoreCooTensors",
     "TPU/XLA device ops"),
    (r"BoostedTrees\w+|IsBoostedTrees\w+", "boosted trees resources"),
    (r"DeviceIndex|DevicePlacementOp|SyncDevice|GraphDefVersion|Timestamp|"
     r"Sleep(Op|IdentityOp)|GuaranteeConst|DtypeWithDefaultOp|TestAttr|"
     r"RequiresOlderGraphVersion|IsTensorFloat32Enabled|\w*Collective\w*Key\w*",
     "process-local queries, sleeps and test ops"),
)


def review(op_def) -> tuple[str, str]:
    """The class of ``op_def`` in the review: ``("host", kind)``, ``("conditional",
    attr)``, ``("embedded", why)``, ``("reviewed", why)``, ``("pure", why)``, or
    ``("unreviewed", why)`` for an
    op nobody has looked at (the registry test fails on those).
    """
    name = op_def.name
    if name in HOST_OPS:
        return "host", HOST_OPS[name]
    if name in CONDITIONAL_HOST_OPS:
        return "conditional", CONDITIONAL_HOST_OPS[name][0]
    if name in EMBEDDED_GRAPH_OPS:
        return "embedded", "runs the serialized graph of an input (the check reads it)"
    for pattern, why in REVIEWED_NOT_HOST:
        if re.fullmatch(pattern, name):
            return "reviewed", why
    suspicious = looks_like_host_op(op_def)
    if suspicious:
        return "unreviewed", f"looks like a host op ({', '.join(suspicious)})"
    if not op_def.is_stateful:
        return "pure", "stateless and not named like a host op"
    for pattern, why in STATEFUL_FAMILIES:
        if re.fullmatch(pattern, name):
            return "pure", why
    return "unreviewed", "stateful, in no reviewed family"
