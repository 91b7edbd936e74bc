"""The example readers (serving_opt.savedmodel.examples): one behaviour per test."""

from __future__ import annotations

import io

import pytest
import tensorflow as tf

from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import examples


def write_records(path: str, records: list[bytes]) -> str:
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    return path


def test_records_read_back_as_tensorflow_wrote_them(tmp_path):
    records = [b"first", b"", b"x" * 70000]
    path = write_records(str(tmp_path / "r.tfrecord"), records)
    assert examples.tfrecord_records(path) == records


def test_the_checksum_without_google_crc32c_is_the_same():
    data = b"serving-opt" * 100
    assert examples._crc32c_python(data) == examples._crc32c()(data)


def test_damaged_data_is_found_when_checked(tmp_path):
    path = write_records(str(tmp_path / "r.tfrecord"), [b"abcdef"])
    damaged = bytearray(open(path, "rb").read())
    damaged[13] ^= 0xFF  # a byte of the data, after the 12-byte header
    with pytest.raises(examples.TFRecordError) as error:
        list(examples.iter_tfrecords(io.BytesIO(bytes(damaged))))
    assert (error.value.problem, error.value.index) == ("data checksum", 0)
    assert [r for _, r in examples.iter_tfrecords(io.BytesIO(bytes(damaged)),
                                                 check_data=False)] == [b"a\x9dcdef"]


def test_a_cut_record_is_named_with_its_index_and_length(tmp_path):
    path = write_records(str(tmp_path / "r.tfrecord"), [b"one", b"twotwo"])
    data = open(path, "rb").read()
    with pytest.raises(examples.TFRecordError) as error:
        list(examples.iter_tfrecords(io.BytesIO(data[:-3])))
    assert (error.value.problem, error.value.index, error.value.length) == ("truncated", 1, 6)


def test_format_is_told_by_the_first_bytes(tmp_path):
    path = write_records(str(tmp_path / "r.tfrecord"), [b"{not json"])
    assert examples.examples_format(open(path, "rb").read(examples.HEAD_BYTES)) == "tfrecord"
    assert examples.examples_format(b'\n  {"x": [1]}\n') == "json"
    assert examples.examples_format(b"x,y\n1,2\n") is None


def test_json_lines_decode_b64_and_strings(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"s": [{"b64": "aGk="}, "yo"], "x": [[1, 2]]}\n\n')
    user = examples.read_examples_file(str(path))
    assert user.requests == ({"s": [b"hi", b"yo"], "x": [[1, 2]]},) and not user.examples


def test_a_file_of_neither_format_is_one_clear_error(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("x,y\n1,2\n")
    with pytest.raises(ServingOptError, match="neither JSON lines nor a TFRecord"):
        examples.read_examples_file(str(path))
