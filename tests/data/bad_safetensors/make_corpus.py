#!/usr/bin/env python3
"""Writes the corpus of malformed safetensors files, one per reject case.

Each file is named after the problem it has; tests/runtime/test_safetensors.cpp
replays every file in this folder, expects each to be rejected with a message,
and checks the message of the named cases. Crash inputs found by fuzzing
(tests/fuzz/fuzz_safetensors.cpp) are added here as fuzz-*.safetensors.
Run from anywhere: python3 make_corpus.py [CASE...] (no CASE: every case)
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def image(header, data=b"", length=None):
    """8-byte little-endian header length, header bytes, data."""
    if isinstance(header, (dict, list)):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode()
    n = len(header) if length is None else length
    return struct.pack("<Q", n) + header + data


def f32(shape, begin, end):
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


def one(entry, data_len=8):
    return image({"t": entry}, b"\0" * data_len)


CASES = {
    "empty_file": b"",
    "too_short": b"\x05\x00\x00",
    "header_too_large": struct.pack("<Q", 200_000_000) + b"{}" + b" " * 6,
    "header_past_eof": image("{}      ", length=1000),
    "header_empty": image(""),
    "header_not_object": image("[1, 2]  "),
    "header_string": image('"hello"'),
    "header_leading_space": image(' {"t":' + json.dumps(f32([2], 0, 8)) + "}", b"\0" * 8),
    "header_nul_padding": image(b'{}\0\0\0\0\0\0'),
    "invalid_json": image('{"t": {"dtype": "F32",'),
    "deep_nesting": image("{" + '"a":' + "[" * 5000 + "]" * 5000 + "}"),
    "entry_not_object": image('{"t": 5}'),
    "entry_array": image('{"t": [1, 2]}'),
    "empty_name": image({"": f32([2], 0, 8)}, b"\0" * 8),
    "duplicate_name": image('{"t":' + json.dumps(f32([1], 0, 4)) + ',"t":'
                            + json.dumps(f32([1], 4, 8)) + "}", b"\0" * 8),
    "missing_dtype": one({"shape": [2], "data_offsets": [0, 8]}),
    "missing_shape": one({"dtype": "F32", "data_offsets": [0, 8]}),
    "missing_data_offsets": one({"dtype": "F32", "shape": [2]}),
    "unknown_field": one({**f32([2], 0, 8), "extra": 1}),
    "duplicate_field": image('{"t": {"dtype": "F32", "dtype": "F16", "shape": [2], '
                             '"data_offsets": [0, 8]}}', b"\0" * 8),
    "dtype_not_string": one({**f32([2], 0, 8), "dtype": ["F32"]}),
    "unsupported_dtype": one({**f32([8], 0, 8), "dtype": "I8"}),
    "shape_not_array": one({**f32([2], 0, 8), "shape": "2"}),
    "shape_object": one({**f32([2], 0, 8), "shape": {"a": 2}}),
    "shape_negative": image('{"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}',
                            b"\0" * 8),
    "shape_not_integer": image('{"t": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}',
                               b"\0" * 8),
    "shape_nested": one({**f32([2], 0, 8), "shape": [[2]]}),
    "shape_overflow": one(f32([4294967296, 4294967296, 4], 0, 8)),
    "shape_too_large": image('{"t": {"dtype": "F32", "shape": [99999999999999999999], '
                             '"data_offsets": [0, 8]}}', b"\0" * 8),
    "offsets_one_value": one({**f32([2], 0, 8), "data_offsets": [0]}),
    "offsets_three_values": one({**f32([2], 0, 8), "data_offsets": [0, 8, 8]}),
    "offsets_not_array": one({**f32([2], 0, 8), "data_offsets": "0,8"}),
    "offsets_negative": image('{"t": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}',
                              b"\0" * 8),
    "offsets_not_integer": image('{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8e0]}}',
                                 b"\0" * 8),
    "offsets_too_large": image('{"t": {"dtype": "F32", "shape": [2], '
                               '"data_offsets": [0, 99999999999999999999]}}', b"\0" * 8),
    "offsets_begin_after_end": one(f32([0], 8, 0)),
    "size_mismatch": one(f32([3], 0, 8)),
    "offsets_beyond_data": one(f32([2], 0, 8), data_len=4),
    "overlap": image({"a": f32([2], 0, 8), "b": f32([2], 4, 12)}, b"\0" * 12),
    "hole": image({"a": f32([1], 0, 4), "b": f32([1], 8, 12)}, b"\0" * 12),
    "leading_hole": image({"a": f32([1], 4, 8)}, b"\0" * 8),
    "incomplete_metadata": image({"a": f32([1], 0, 4)}, b"\0" * 8),
    "metadata_not_object": image({"__metadata__": "x", "t": f32([2], 0, 8)}, b"\0" * 8),
    "metadata_array": image({"__metadata__": ["x"], "t": f32([2], 0, 8)}, b"\0" * 8),
    "metadata_value_object": image({"__metadata__": {"k": {"a": "b"}}, "t": f32([2], 0, 8)},
                                   b"\0" * 8),
    "metadata_duplicate_key": image('{"__metadata__": {"k": "a", "k": "b"}}'),
    "metadata_twice": image('{"__metadata__": {}, "__metadata__": {}}'),
    # JSON types are exact: a number is not a string, nor the other way round,
    # and [], {} and "" are three different things.
    "shape_string": one({**f32([2], 0, 8), "shape": ["2"]}),
    "shape_empty_object": one({**f32([], 0, 4), "shape": {}}, data_len=4),
    "shape_empty_string": one({**f32([], 0, 4), "shape": ""}, data_len=4),
    "offsets_string": one({**f32([2], 0, 8), "data_offsets": [0, "8"]}),
    "offsets_float": image('{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8.0]}}',
                           b"\0" * 8),
    "entry_empty_array": image('{"t": []}'),
    "metadata_value_number": image({"__metadata__": {"k": 5}, "t": f32([2], 0, 8)}, b"\0" * 8),
}


def main(names):
    """Writes the named cases, or all of them when none are named."""
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"no such case: {', '.join(unknown)}")
    for name in names or CASES:
        with open(os.path.join(HERE, name + ".safetensors"), "wb") as f:
            f.write(CASES[name])
    print(f"wrote {len(names or CASES)} files to {HERE}")


if __name__ == "__main__":
    main(sys.argv[1:])
