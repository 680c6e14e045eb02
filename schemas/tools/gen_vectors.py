#!/usr/bin/python3
"""Generate the golden job vectors in schemas/vectors/ and their manifest.

Run with Debian's python3 (python3-msgpack):  /usr/bin/python3 schemas/tools/gen_vectors.py
The output is committed; rerunning must give identical bytes (check with git diff).

Each vector is one Kafka message value. The manifest (vectors/manifest.json)
lists, per vector: the file, the content-type header to present (null =
none, the decoder sniffs), optional limit overrides, the expected outcome
("ok" or "reject"), for rejects the reject code and the field it names, and
for valid jobs the decoded fields to compare.

msgpack is written by python-msgpack where the value is ordinary, and by the
small helpers below where the bytes must be crafted (duplicate keys, invalid
UTF-8, lying length headers, NaN, ...).
"""
import json
import math
import os
import shutil
import struct
import sys

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(HERE), "vectors")
SEEDS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "fuzz", "seeds", "fuzz_job_decode")
# fuzz_job_decode reads its first byte as the content-type choice: 0 none, 1 msgpack, 2 json, 3 other.
SEED_CT = {None: 0, "application/msgpack": 1, "application/x-msgpack": 1, "application/json": 2}

# Defaults of moeq_job_limits (schemas/include/moeq/job.h); the edges below use them.
LIM = dict(max_job_bytes=1048576, max_id_bytes=256, max_prompt_bytes=524288, max_input_tokens=131072,
           max_new_tokens=8192, max_messages=1024, max_stop=16, max_stop_bytes=256, max_string_bytes=256,
           max_metadata_bytes=16384, max_depth=32, max_schema_bytes=32768, max_pattern_bytes=1024,
           max_choices=256, max_choice_bytes=1024, max_stop_token_ids=64)

# Defaults of the optional fields (schemas/job.md).
DEFAULTS = dict(priority=2, max_new_tokens=512, temperature=1.0, top_p=1.0, top_k=0, seed=None, stop=[],
                deadline_ms=0, reply_to=None, mtp=True, metadata=None, response_format=None, logprobs=False,
                top_logprobs=0, stop_token_ids=[], min_tokens=0, repetition_penalty=1.0, presence_penalty=0.0,
                frequency_penalty=0.0)

vectors = []


# ---- crafted msgpack -------------------------------------------------------

def pk(obj):
    """Ordinary msgpack (str for text, bin for bytes)."""
    return msgpack.packb(obj, use_bin_type=True)


def mp_str_raw(b):
    """A msgpack str holding arbitrary bytes (possibly invalid UTF-8)."""
    n = len(b)
    if n < 32:
        return bytes([0xA0 | n]) + b
    if n < 256:
        return b"\xd9" + bytes([n]) + b
    if n < 65536:
        return b"\xda" + struct.pack(">H", n) + b
    return b"\xdb" + struct.pack(">I", n) + b


def mp_map(items):
    """A map from (key, encoded value) pairs, in order, duplicates allowed. Keys: str (packed) or bytes (raw)."""
    n = len(items)
    head = bytes([0x80 | n]) if n < 16 else (b"\xde" + struct.pack(">H", n))
    body = b"".join((k if isinstance(k, bytes) else pk(k)) + v for k, v in items)
    return head + body


def mp_array(encoded):
    n = len(encoded)
    head = bytes([0x90 | n]) if n < 16 else (b"\xdc" + struct.pack(">H", n) if n < 65536 else b"\xdd" + struct.pack(">I", n))
    return head + b"".join(encoded)


def mp_job(**fields):
    """A job map from keyword fields; values are Python values (packed) or bytes (already encoded)."""
    return mp_map([(k, v if isinstance(v, bytes) else pk(v)) for k, v in fields.items()])


def base(**over):
    """The fields of a minimal valid job, with overrides (None value = drop the field)."""
    f = {"v": 1, "id": "job-1", "prompt": "Summarise: the cat sat on the mat."}
    for k, v in over.items():
        if v is None:
            f.pop(k, None)
        else:
            f[k] = v
    return f


def js(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def js_fields(fields):
    """A JSON object from (key, raw JSON text) pairs, in order, duplicates allowed."""
    return b"{" + b",".join(json.dumps(k).encode() + b":" + v for k, v in fields) + b"}"


# ---- registering vectors ---------------------------------------------------

def add(name, data, ext, expect, code=None, field=None, job=None, content_type=None, limits=None, note=None):
    sub = "valid" if expect == "ok" else "invalid"
    rel = f"{sub}/{name}.{ext}"
    path = os.path.join(OUT, rel)
    with open(path, "wb") as f:
        f.write(data)
    v = {"name": name, "file": rel, "content_type": content_type, "expect": expect}
    if limits:
        v["limits"] = limits
    if code:
        v["code"] = code
        v["field"] = field if field is not None else ""
    if job is not None:
        full = dict(DEFAULTS)
        full.update(job)
        full["format"] = "msgpack" if ext == "msgpack" else "json"
        if isinstance(full.get("metadata"), bytes):
            full["metadata_hex"] = full.pop("metadata").hex()
        else:
            full["metadata_hex"] = None
            full.pop("metadata", None)
        v["job"] = full
    if note:
        v["note"] = note
    vectors.append(v)


def ok_both(name, fields, job, note=None, json_fields=None):
    """A valid job in both encodings (ordinary values)."""
    add(name, pk(fields), "msgpack", "ok", job=job, note=note)
    add(name, js(json_fields if json_fields is not None else fields), "json", "ok", job=job, note=note)


def bad_both(name, fields, code, field, note=None, limits=None):
    add(name, pk(fields), "msgpack", "reject", code, field, limits=limits, note=note)
    add(name, js(fields), "json", "reject", code, field, limits=limits, note=note)


def nested(depth_levels, leaf=0):
    """Python value: `depth_levels` nested lists around leaf."""
    v = leaf
    for _ in range(depth_levels):
        v = [v]
    return v


def gen_valid():
    P = "Summarise: the cat sat on the mat."
    ok_both("prompt_minimal", base(), {"id": "job-1", "input": "prompt", "prompt": P},
            note="only v, id and an input; every other field takes its default")
    full = {"v": 1, "id": "doc-42/chunk-7", "priority": 0, "prompt": P, "max_new_tokens": 128,
            "temperature": 0.25, "top_p": 0.9, "top_k": 40, "seed": 1234567, "stop": ["\n\n", "END"],
            "deadline_ms": 1767225600000, "reply_to": "team-a.results", "mtp": False}
    ok_both("all_fields", full, {"id": "doc-42/chunk-7", "priority": 0, "input": "prompt", "prompt": P,
                                 "max_new_tokens": 128, "temperature": 0.25, "top_p": 0.9, "top_k": 40,
                                 "seed": 1234567, "stop": ["\n\n", "END"], "deadline_ms": 1767225600000,
                                 "reply_to": "team-a.results", "mtp": False})
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Héllo, wörld — 你好 😀"},
            {"role": "assistant", "content": ""}, {"role": "user", "content": "Again?", "name": "ignored"}]
    ok_both("messages_chat", base(prompt=None, messages=msgs),
            {"id": "job-1", "input": "messages",
             "messages": [[m["role"], m["content"]] for m in msgs]},
            note="an empty assistant turn is allowed; unknown keys in a message are ignored")
    ok_both("tokens_input", base(prompt=None, tokens=[0, 1, 127, 128, 65535, 65536, 2147483647]),
            {"id": "job-1", "input": "tokens", "tokens": [0, 1, 127, 128, 65535, 65536, 2147483647]},
            note="token ids span every msgpack integer width up to INT32_MAX")
    ok_both("unknown_fields_ignored", base(future_field={"a": [1, 2, {"b": None}]}, x_trace="abc", zz=1.5),
            {"id": "job-1", "input": "prompt", "prompt": P}, note="forward compatibility")
    ok_both("nulls_mean_absent", base(temperature=None, reply_to=None) | {"temperature": None, "seed": None,
                                                                          "metadata": None, "stop": None},
            {"id": "job-1", "input": "prompt", "prompt": P}, note="null for an optional field = absent")
    ok_both("ints_where_floats_allowed", base(temperature=0, top_p=1), {"id": "job-1", "input": "prompt",
                                                                         "prompt": P, "temperature": 0.0,
                                                                         "top_p": 1.0})
    ok_both("seed_u64_max", base(seed=2**64 - 1), {"id": "job-1", "input": "prompt", "prompt": P,
                                                   "seed": 2**64 - 1})
    # nested metadata, echoed verbatim: the expected bytes are the value's own encoding
    meta = {"tenant": "acme", "tags": ["a", "b"], "n": {"deep": {"er": [1, 2.5, True, None]}}, "ü": "ß"}
    mbytes = pk(meta)
    add("metadata_nested", mp_job(**base(), metadata=mbytes), "msgpack", "ok",
        job={"id": "job-1", "input": "prompt", "prompt": P, "metadata": mbytes})
    mjson = b'{ "tenant" : "acme", "tags":["a","b"],\n "n":{"deep":{"er":[1,2.5,true,null]}}, "\\u00fc":"\xc3\x9f" }'
    add("metadata_nested", js_fields([("v", b"1"), ("id", b'"job-1"'), ("prompt", js(P)), ("metadata", mjson)]),
        "json", "ok", job={"id": "job-1", "input": "prompt", "prompt": P, "metadata": mjson},
        note="JSON metadata is kept byte for byte, whitespace and escapes included")
    mext = mp_map([("k", b"\xc4\x03\x00\x01\x02"), ("t", b"\xd6\xff\x00\x00\x00\x01"), (b"\x07", pk("int key"))])
    add("metadata_bin_ext_int_keys", mp_job(**base(), metadata=mext), "msgpack", "ok",
        job={"id": "job-1", "input": "prompt", "prompt": P, "metadata": mext},
        note="msgpack metadata is opaque: bin, ext (timestamp) and integer keys pass through")
    mdup = mp_map([("a", pk(1)), ("a", pk(2))])
    add("metadata_duplicate_keys", mp_job(**base(), metadata=mdup), "msgpack", "ok",
        job={"id": "job-1", "input": "prompt", "prompt": P, "metadata": mdup},
        note="metadata is opaque: duplicate keys inside it are echoed, not judged")
    add("unknown_key_repeated", mp_map([(k, pk(v)) for k, v in base().items()] + [("x", pk(1)), ("x", pk(2))]),
        "msgpack", "ok", job={"id": "job-1", "input": "prompt", "prompt": P})
    add("unknown_key_repeated", js_fields([(k, js(v)) for k, v in base().items()] + [("x", b"1"), ("x", b"2")]),
        "json", "ok", job={"id": "job-1", "input": "prompt", "prompt": P})
    # JSON specifics
    add("json_whitespace_escapes", b' \r\n\t{ "v" : 1 , "\\u0069d":"a\\"b\\\\c\\/d" ,\n"prompt" : "\\ud83d\\ude00 \\u00e9\\t\\n" }\n ',
        "json", "ok", job={"id": "a\"b\\c/d", "input": "prompt", "prompt": "😀 é\t\n"},
        note="escapes in keys and values, a surrogate pair, whitespace around everything")
    add("json_content_type_params", js(base()), "json", "ok", content_type="Application/JSON; charset=utf-8",
        job={"id": "job-1", "input": "prompt", "prompt": P})
    add("msgpack_content_type_x", pk(base()), "msgpack", "ok", content_type="application/x-msgpack",
        job={"id": "job-1", "input": "prompt", "prompt": P})
    add("unknown_content_type_sniffed", pk(base()), "msgpack", "ok", content_type="text/plain",
        job={"id": "job-1", "input": "prompt", "prompt": P}, note="an unknown content-type falls back to sniffing")
    add("json_big_exponent_in_unknown", js_fields([(k, js(v)) for k, v in base().items()] + [("x", b"-0.0e-999")]),
        "json", "ok", job={"id": "job-1", "input": "prompt", "prompt": P})
    # msgpack specifics
    f32 = mp_job(**base(), temperature=b"\xca" + struct.pack(">f", 0.5))
    add("msgpack_float32", f32, "msgpack", "ok", job={"id": "job-1", "input": "prompt", "prompt": P,
                                                       "temperature": 0.5})
    wide = b"\xdf" + struct.pack(">I", 3) + pk("v") + b"\xcf" + struct.pack(">Q", 1) + \
        b"\xdb" + struct.pack(">I", 2) + b"id" + b"\xdb" + struct.pack(">I", 5) + b"job-1" + \
        pk("prompt") + b"\xda" + struct.pack(">H", len(P)) + P.encode()
    add("msgpack_widest_headers", wide, "msgpack", "ok", job={"id": "job-1", "input": "prompt", "prompt": P},
        note="map32, uint64, str32 and str16 where fix forms would do")
    # limit edges that pass (defaults)
    ok_both("id_at_limit", base(id="i" * LIM["max_id_bytes"]), {"id": "i" * 256, "input": "prompt", "prompt": P})
    ok_both("max_new_tokens_at_cap", base(max_new_tokens=LIM["max_new_tokens"]),
            {"id": "job-1", "input": "prompt", "prompt": P, "max_new_tokens": 8192})
    stops = [("s%02d" % i) * 1 for i in range(LIM["max_stop"] - 1)] + ["x" * LIM["max_stop_bytes"]]
    ok_both("stop_at_limits", base(stop=stops), {"id": "job-1", "input": "prompt", "prompt": P, "stop": stops})
    ok_both("priority_edges", base(priority=3), {"id": "job-1", "input": "prompt", "prompt": P, "priority": 3})
    ok_both("sampling_edges", base(temperature=2.0, top_p=1e-9, top_k=2147483647),
            {"id": "job-1", "input": "prompt", "prompt": P, "temperature": 2.0, "top_p": 1e-9,
             "top_k": 2147483647})
    deep_ok = {"m": nested(LIM["max_depth"] - 2)}  # job map 1, metadata map 2, lists 3..32
    add("metadata_depth_at_limit", mp_job(**base(), metadata=pk(deep_ok)), "msgpack", "ok",
        job={"id": "job-1", "input": "prompt", "prompt": P, "metadata": pk(deep_ok)})
    add("metadata_depth_at_limit", js_fields([(k, js(v)) for k, v in base().items()] + [("metadata", js(deep_ok))]),
        "json", "ok", job={"id": "job-1", "input": "prompt", "prompt": P, "metadata": js(deep_ok)})
    big_meta = {"pad": "p" * (LIM["max_metadata_bytes"] - 8)}
    assert len(pk(big_meta)) == LIM["max_metadata_bytes"], len(pk(big_meta))
    add("metadata_at_limit", mp_job(**base(), metadata=pk(big_meta)), "msgpack", "ok",
        job={"id": "job-1", "input": "prompt", "prompt": P, "metadata": pk(big_meta)})
    # configurable limits: small overrides keep the files small
    ok_small = {"max_prompt_bytes": 34, "max_input_tokens": 4, "max_messages": 2, "max_job_bytes": 200}
    add("limits_override_at_edges", pk(base()), "msgpack", "ok", limits=ok_small,
        job={"id": "job-1", "input": "prompt", "prompt": P})
    add("limits_override_tokens_at_edge", pk(base(prompt=None, tokens=[1, 2, 3, 4])), "msgpack", "ok",
        limits=ok_small, job={"id": "job-1", "input": "tokens", "tokens": [1, 2, 3, 4]})
    add("default_max_new_tokens_clamped", pk(base()), "msgpack", "ok", limits={"max_new_tokens": 100},
        job={"id": "job-1", "input": "prompt", "prompt": P, "max_new_tokens": 100},
        note="the default 512 is clamped to a lower cap")


SCHEMA = {"type": "object", "properties": {"party": {"type": "string"}, "amount": {"type": "number"},
                                           "date": {"type": "string", "format": "date"}},
          "required": ["party", "amount"], "additionalProperties": False}


def gen_structured_valid():
    P = "Summarise: the cat sat on the mat."
    rf = {"type": "json_schema", "json_schema": {"name": "invoice", "schema": SCHEMA, "strict": True}}
    ok_both("response_format_json_schema", base(response_format=rf),
            {"id": "job-1", "input": "prompt", "prompt": P,
             "response_format": {"type": "json_schema", "name": "invoice", "strict": True, "schema": SCHEMA}},
            note="the schema is kept as JSON text (msgpack transcoded); the worker compiles it")
    ok_both("response_format_json_object", base(response_format={"type": "json_object"}),
            {"id": "job-1", "input": "prompt", "prompt": P, "response_format": {"type": "json_object"}})
    ok_both("response_format_regex", base(response_format={"type": "regex", "pattern": "[0-9]{4}-[0-9]{2}"}),
            {"id": "job-1", "input": "prompt", "prompt": P,
             "response_format": {"type": "regex", "pattern": "[0-9]{4}-[0-9]{2}"}})
    ok_both("response_format_choice", base(response_format={"type": "choice", "choices": ["yes", "no", "unsure"]}),
            {"id": "job-1", "input": "prompt", "prompt": P,
             "response_format": {"type": "choice", "choices": ["yes", "no", "unsure"]}})
    ok_both("response_format_text", base(response_format={"type": "text"}),
            {"id": "job-1", "input": "prompt", "prompt": P}, note="type text = unconstrained, as absent")
    ctl = base(max_new_tokens=64, logprobs=True, top_logprobs=20, stop_token_ids=[0, 7, 2147483647], min_tokens=64,
               repetition_penalty=2.0, presence_penalty=-2.0, frequency_penalty=1.5)
    ok_both("decoding_controls_at_edges", ctl,
            {"id": "job-1", "input": "prompt", "prompt": P, "max_new_tokens": 64, "logprobs": True,
             "top_logprobs": 20, "stop_token_ids": [0, 7, 2147483647], "min_tokens": 64,
             "repetition_penalty": 2.0, "presence_penalty": -2.0, "frequency_penalty": 1.5},
            note="min_tokens may equal max_new_tokens")


def gen_structured_invalid():
    rf_schema = lambda schema: {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    bad_both("response_format_type_unknown", base(response_format={"type": "grammar"}), "invalid_value",
             "response_format.type")
    bad_both("response_format_without_type", base(response_format={"pattern": "a"}), "missing_field",
             "response_format")
    bad_both("response_format_schema_missing", base(response_format={"type": "json_schema"}), "missing_field",
             "response_format")
    bad_both("response_format_json_schema_without_schema",
             base(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "missing_field",
             "response_format.json_schema")
    bad_both("response_format_schema_not_a_map", base(response_format=rf_schema("string")), "wrong_type",
             "response_format.json_schema.schema")
    bad_both("response_format_schema_too_large", base(response_format=rf_schema({"description": "d" * 64})),
             "too_large", "response_format.json_schema.schema", limits={"max_schema_bytes": 32})
    bad_both("response_format_pattern_too_long", base(response_format={"type": "regex", "pattern": "a" * 1025}),
             "too_large", "response_format.pattern")
    bad_both("response_format_regex_without_pattern", base(response_format={"type": "regex"}), "missing_field",
             "response_format")
    bad_both("response_format_choices_empty", base(response_format={"type": "choice", "choices": []}),
             "invalid_value", "response_format.choices")
    bad_both("response_format_choices_too_many",
             base(response_format={"type": "choice", "choices": ["c%d" % i for i in range(257)]}), "too_large",
             "response_format.choices")
    bad_both("response_format_choice_empty_string", base(response_format={"type": "choice", "choices": ["a", ""]}),
             "invalid_value", "response_format.choices[1]")
    bad_both("top_logprobs_above_20", base(logprobs=True, top_logprobs=21), "out_of_range", "top_logprobs")
    bad_both("top_logprobs_without_logprobs", base(top_logprobs=2), "invalid_value", "top_logprobs")
    bad_both("logprobs_not_a_boolean", base(logprobs=1), "wrong_type", "logprobs")
    bad_both("repetition_penalty_zero", base(repetition_penalty=0), "out_of_range", "repetition_penalty")
    bad_both("presence_penalty_above_2", base(presence_penalty=2.5), "out_of_range", "presence_penalty")
    bad_both("frequency_penalty_below_minus_2", base(frequency_penalty=-3), "out_of_range", "frequency_penalty")
    bad_both("stop_token_ids_negative", base(stop_token_ids=[1, -1]), "out_of_range", "stop_token_ids[1]")
    bad_both("stop_token_ids_too_many", base(stop_token_ids=list(range(65))), "too_large", "stop_token_ids")
    bad_both("min_tokens_above_max_new_tokens", base(max_new_tokens=10, min_tokens=11), "out_of_range",
             "min_tokens")


def gen_invalid():
    P = "Summarise."
    # malformed
    add("empty", b"", "msgpack", "reject", "malformed", "")
    add("neither_format", b"hello world", "json", "reject", "malformed", "")
    add("truncated_json", js(base())[:-7], "json", "reject", "malformed", "prompt")
    add("truncated_msgpack", pk(base())[:-3], "msgpack", "reject", "malformed", "prompt")
    add("trailing_bytes_msgpack", pk(base()) + b"\xc0", "msgpack", "reject", "malformed", "")
    add("trailing_garbage_json", js(base()) + b" {}", "json", "reject", "malformed", "")
    add("never_used_byte_c1", mp_job(**base(), x=b"\xc1"), "msgpack", "reject", "malformed", "x")
    add("json_single_quotes", b"{'v': 1, 'id': 'a', 'prompt': 'b'}", "json", "reject", "malformed", "")
    add("json_nan_literal", js_fields([(k, js(v)) for k, v in base().items()] + [("temperature", b"NaN")]), "json",
        "reject", "malformed", "temperature")
    add("json_trailing_comma", b'{"v":1,"id":"a","prompt":"b",}', "json", "reject", "malformed", "")
    add("json_leading_zero", b'{"v":01,"id":"a","prompt":"b"}', "json", "reject", "malformed", "")
    add("json_control_char_in_string", b'{"v":1,"id":"a","prompt":"line\nbreak"}', "json", "reject", "malformed",
        "prompt")
    add("json_bad_escape", b'{"v":1,"id":"a","prompt":"\\x41"}', "json", "reject", "malformed", "prompt")
    add("json_declared_but_msgpack", pk(base()), "msgpack", "reject", "malformed", "",
        content_type="application/json")
    # lying length headers: must fail without allocating the declared size
    add("huge_str32_short_body", mp_map([("v", pk(1)), ("id", b"\xdb\xff\xff\xff\xffabc")]), "msgpack", "reject",
        "malformed", "id")
    add("huge_array32_short_body", mp_map([("v", pk(1)), ("id", pk("a")), ("tokens", b"\xdd\xff\xff\xff\xff\x01")]),
        "msgpack", "reject", "malformed", "tokens")
    add("huge_map32_short_body", b"\xdf\xff\xff\xff\xff" + pk("v") + pk(1), "msgpack", "reject", "malformed", "")
    add("huge_bin32_in_metadata", mp_job(**base(), metadata=mp_map([("b", b"\xc6\x7f\xff\xff\xff\x00")])), "msgpack",
        "reject", "malformed", "metadata")
    add("huge_ext32_unknown_field", mp_job(**base(), x=b"\xc9\xff\xff\xff\xf0\x01"), "msgpack", "reject",
        "malformed", "x")
    add("huge_array_in_messages", mp_job(**base(prompt=None), messages=b"\xdc\xff\xff"), "msgpack", "reject",
        "malformed", "messages")
    # not a map
    add("top_array_msgpack", pk([1, 2]), "msgpack", "reject", "not_a_map", "", content_type="application/msgpack")
    add("top_string_msgpack", pk("job"), "msgpack", "reject", "not_a_map", "", content_type="application/msgpack")
    add("top_array_json", b'[{"v":1}]', "json", "reject", "not_a_map", "", content_type="application/json")
    # version
    bad_both("version_2", base(v=2), "unsupported_version", "v")
    bad_both("version_0", base(v=0), "unsupported_version", "v")
    bad_both("version_missing", base(v=None), "missing_field", "v")
    bad_both("version_string", base(v="1"), "wrong_type", "v")
    add("version_2_wins_over_bad_fields", pk(base(v=2, priority="urgent", max_new_tokens=-1)), "msgpack", "reject",
        "unsupported_version", "v", note="the version is judged before any field")
    # missing
    bad_both("id_missing", base(id=None), "missing_field", "id")
    bad_both("id_null", base(id=None) | {"id": None}, "missing_field", "id")
    bad_both("input_missing", base(prompt=None), "missing_field", "")
    bad_both("message_without_role", base(prompt=None, messages=[{"content": "hi"}]), "missing_field",
             "messages[0]")
    bad_both("message_without_content", base(prompt=None, messages=[{"role": "user"}]), "missing_field",
             "messages[0]")
    # wrong types
    for name, over, field in [
        ("id_integer", {"id": 42}, "id"),
        ("priority_string", {"priority": "1"}, "priority"),
        ("max_new_tokens_float", {"max_new_tokens": 5.0}, "max_new_tokens"),
        ("temperature_string", {"temperature": "hot"}, "temperature"),
        ("top_k_float", {"top_k": 1.5}, "top_k"),
        ("seed_float", {"seed": 1.0}, "seed"),
        ("deadline_string", {"deadline_ms": "2026-01-01"}, "deadline_ms"),
        ("mtp_integer", {"mtp": 1}, "mtp"),
        ("stop_string_not_array", {"stop": "END"}, "stop"),
        ("stop_entry_integer", {"stop": ["a", 7]}, "stop[1]"),
        ("prompt_array", {"prompt": ["a", "b"]}, "prompt"),
        ("metadata_array", {"metadata": [1, 2]}, "metadata"),
        ("metadata_string", {"metadata": "x"}, "metadata"),
        ("reply_to_integer", {"reply_to": 5}, "reply_to"),
        ("messages_map", {"prompt": None, "messages": {"role": "user", "content": "hi"}}, "messages"),
        ("message_not_map", {"prompt": None, "messages": ["hi"]}, "messages[0]"),
        ("message_content_array", {"prompt": None, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
         "messages[0].content"),
        ("tokens_string", {"prompt": None, "tokens": "1 2 3"}, "tokens"),
        ("token_float", {"prompt": None, "tokens": [1, 2.0]}, "tokens[1]"),
        ("token_string", {"prompt": None, "tokens": [1, "2"]}, "tokens[1]"),
    ]:
        bad_both(name, base(**over), "wrong_type", field)
    add("prompt_bin", mp_job(**base(prompt=None), prompt=b"\xc4\x02hi"), "msgpack", "reject", "wrong_type",
        "prompt", note="text must be a msgpack str, not bin")
    add("key_not_string", mp_map([("v", pk(1)), (pk(7), pk("x")), ("id", pk("a")), ("prompt", pk(P))]), "msgpack",
        "reject", "wrong_type", "")
    # out of range
    for name, over, field in [
        ("priority_4", {"priority": 4}, "priority"),
        ("priority_negative", {"priority": -1}, "priority"),
        ("max_new_tokens_zero", {"max_new_tokens": 0}, "max_new_tokens"),
        ("max_new_tokens_over_cap", {"max_new_tokens": 100000}, "max_new_tokens"),
        ("max_new_tokens_cap_plus_1", {"max_new_tokens": LIM["max_new_tokens"] + 1}, "max_new_tokens"),
        ("max_new_tokens_negative", {"max_new_tokens": -5}, "max_new_tokens"),
        ("max_new_tokens_u64", {"max_new_tokens": 2**64 - 1}, "max_new_tokens"),
        ("temperature_negative", {"temperature": -0.1}, "temperature"),
        ("temperature_too_high", {"temperature": 2.5}, "temperature"),
        ("top_p_zero", {"top_p": 0}, "top_p"),
        ("top_p_over_1", {"top_p": 1.5}, "top_p"),
        ("top_k_negative", {"top_k": -1}, "top_k"),
        ("top_k_over_int32", {"top_k": 2**31}, "top_k"),
        ("seed_negative", {"seed": -1}, "seed"),
        ("deadline_negative", {"deadline_ms": -1}, "deadline_ms"),
        ("token_negative", {"prompt": None, "tokens": [5, -1]}, "tokens[1]"),
        ("token_over_int32", {"prompt": None, "tokens": [2**31]}, "tokens[0]"),
    ]:
        bad_both(name, base(**over), "out_of_range", field)
    for name, val in [("nan", float("nan")), ("inf", float("inf")), ("neg_inf", float("-inf"))]:
        add("temperature_" + name, mp_job(**base(), temperature=b"\xcb" + struct.pack(">d", val)), "msgpack",
            "reject", "out_of_range", "temperature")
    add("top_p_nan_float32", mp_job(**base(), top_p=b"\xca" + struct.pack(">f", float("nan"))), "msgpack", "reject",
        "out_of_range", "top_p")
    add("temperature_1e999", js_fields([(k, js(v)) for k, v in base().items()] + [("temperature", b"1e999")]),
        "json", "reject", "out_of_range", "temperature", note="overflows to infinity")
    add("max_new_tokens_huge_json", js_fields([(k, js(v)) for k, v in base().items()] +
                                              [("max_new_tokens", b"123456789012345678901234567890")]),
        "json", "reject", "wrong_type", "max_new_tokens",
        note="beyond 64 bits a JSON integer can only be read as a float")
    # too large
    add("job_over_max_bytes", pk(base()), "msgpack", "reject", "too_large", "", limits={"max_job_bytes": 20})
    bad_both("id_over_limit", base(id="i" * (LIM["max_id_bytes"] + 1)), "too_large", "id")
    bad_both("prompt_over_limit", base(prompt="p" * 35), "too_large", "prompt", limits={"max_prompt_bytes": 34})
    bad_both("messages_content_total_over_limit",
             base(prompt=None, messages=[{"role": "user", "content": "a" * 20}, {"role": "user", "content": "b" * 20}]),
             "too_large", "messages[1].content", limits={"max_prompt_bytes": 34})
    bad_both("messages_over_limit", base(prompt=None, messages=[{"role": "user", "content": "x"}] * 3), "too_large",
             "messages", limits={"max_messages": 2})
    bad_both("tokens_over_limit", base(prompt=None, tokens=[1, 2, 3, 4, 5]), "too_large", "tokens",
             limits={"max_input_tokens": 4})
    bad_both("stop_over_count", base(stop=["s"] * (LIM["max_stop"] + 1)), "too_large", "stop")
    bad_both("stop_string_over_limit", base(stop=["x" * (LIM["max_stop_bytes"] + 1)]), "too_large", "stop[0]")
    bad_both("role_over_limit", base(prompt=None, messages=[{"role": "u" * 300, "content": "x"}]), "too_large",
             "messages[0].role")
    bad_both("reply_to_over_kafka_limit", base(reply_to="t" * 250), "too_large", "reply_to",
             limits={"max_string_bytes": 1000})
    big_meta = {"pad": "p" * (LIM["max_metadata_bytes"] - 7)}
    add("metadata_over_limit", mp_job(**base(), metadata=pk(big_meta)), "msgpack", "reject", "too_large", "metadata")
    add("metadata_over_limit", js(base(metadata=big_meta)), "json", "reject", "too_large", "metadata")
    # invalid UTF-8 (msgpack str and raw JSON bytes), NUL, surrogates
    bad_seqs = [("lone_continuation", b"\x80"), ("overlong_slash", b"\xc0\xaf"), ("cesu_surrogate", b"\xed\xa0\x80"),
                ("above_10ffff", b"\xf4\x90\x80\x80"), ("truncated_3byte", b"\xe2\x82"), ("byte_ff", b"\xff")]
    for sname, seq in bad_seqs:
        add("utf8_prompt_" + sname, mp_job(**base(prompt=None), prompt=mp_str_raw(b"abc" + seq + b"def")),
            "msgpack", "reject", "invalid_utf8", "prompt")
    add("utf8_id", mp_map([("v", pk(1)), ("id", mp_str_raw(b"job\xff")), ("prompt", pk(P))]), "msgpack", "reject",
        "invalid_utf8", "id")
    add("utf8_stop", mp_job(**base(), stop=mp_array([pk("ok"), mp_str_raw(b"\xc3")])), "msgpack", "reject",
        "invalid_utf8", "stop")
    add("utf8_message_content", mp_job(**base(prompt=None), messages=mp_array([mp_map(
        [("role", pk("user")), ("content", mp_str_raw(b"caf\xe9"))])])), "msgpack", "reject", "invalid_utf8",
        "messages")
    add("utf8_key", mp_map([("v", pk(1)), (mp_str_raw(b"k\xfe"), pk(1)), ("id", pk("a")), ("prompt", pk(P))]),
        "msgpack", "reject", "invalid_utf8", "")
    add("utf8_in_unknown_field", mp_job(**base(), extra=mp_str_raw(b"\xed\xbf\xbf")), "msgpack", "reject",
        "invalid_utf8", "extra", note="every string in the document must be text, known field or not")
    add("utf8_in_metadata", mp_job(**base(), metadata=mp_map([("k", mp_str_raw(b"\x80"))])), "msgpack", "reject",
        "invalid_utf8", "metadata")
    add("nul_in_prompt_msgpack", mp_job(**base(prompt=None), prompt=mp_str_raw(b"a\x00b")), "msgpack", "reject",
        "invalid_utf8", "prompt")
    add("utf8_id_json", b'{"v":1,"id":"job\xff","prompt":"x"}', "json", "reject", "invalid_utf8", "id")
    add("utf8_prompt_json", b'{"v":1,"id":"a","prompt":"caf\xe9"}', "json", "reject", "invalid_utf8", "prompt")
    add("utf8_stop_json", b'{"v":1,"id":"a","prompt":"x","stop":["\xed\xa0\x80"]}', "json", "reject",
        "invalid_utf8", "stop")
    add("utf8_message_json", b'{"v":1,"id":"a","messages":[{"role":"user","content":"\xc0\x80"}]}', "json",
        "reject", "invalid_utf8", "messages")
    add("surrogate_lone_high_json", b'{"v":1,"id":"a","prompt":"x\\ud800y"}', "json", "reject", "invalid_utf8",
        "prompt")
    add("surrogate_lone_low_json", b'{"v":1,"id":"a","prompt":"\\udc00"}', "json", "reject", "invalid_utf8",
        "prompt")
    add("surrogate_high_then_high_json", b'{"v":1,"id":"a","prompt":"\\ud800\\ud800"}', "json", "reject",
        "invalid_utf8", "prompt")
    add("surrogate_high_at_end_json", b'{"v":1,"id":"a","prompt":"\\ud83d"}', "json", "reject", "invalid_utf8",
        "prompt")
    add("surrogate_in_id_json", b'{"v":1,"id":"\\udfff","prompt":"x"}', "json", "reject", "invalid_utf8", "id")
    add("nul_escape_json", b'{"v":1,"id":"a","prompt":"a\\u0000b"}', "json", "reject", "invalid_utf8", "prompt")
    # too deep
    deep = {"m": nested(LIM["max_depth"] - 1)}
    add("metadata_too_deep", mp_job(**base(), metadata=pk(deep)), "msgpack", "reject", "too_deep", "metadata")
    add("metadata_too_deep", js(base(metadata=deep)), "json", "reject", "too_deep", "metadata")
    add("unknown_field_20k_deep_json", js_fields([(k, js(v)) for k, v in base().items()] +
                                                  [("x", b"[" * 20000 + b"]" * 20000)]),
        "json", "reject", "too_deep", "x", note="must not recurse 20000 levels deep")
    add("unknown_field_20k_deep_msgpack", mp_job(**base(), x=b"\x91" * 20000 + b"\x00"), "msgpack", "reject",
        "too_deep", "x")
    add("depth_limit_override", pk(base(metadata={"a": [[1]]})), "msgpack", "reject", "too_deep", "metadata",
        limits={"max_depth": 3})
    # conflicting input
    bad_both("prompt_and_tokens", base(tokens=[1, 2]), "conflicting_input", "tokens")
    bad_both("prompt_and_messages", base(messages=[{"role": "user", "content": "x"}]), "conflicting_input",
             "messages")
    # duplicate keys
    add("duplicate_id", mp_map([("v", pk(1)), ("id", pk("a")), ("id", pk("b")), ("prompt", pk(P))]), "msgpack",
        "reject", "duplicate_key", "id")
    add("duplicate_id", b'{"v":1,"id":"a","prompt":"x","id":"b"}', "json", "reject", "duplicate_key", "id")
    add("duplicate_max_new_tokens_escaped", b'{"v":1,"id":"a","prompt":"x","max_new_tokens":5,"max_new_token\\u0073":6}',
        "json", "reject", "duplicate_key", "max_new_tokens", note="keys compare after unescaping")
    add("duplicate_null_then_value", b'{"v":1,"id":"a","prompt":"x","seed":null,"seed":5}', "json", "reject",
        "duplicate_key", "seed")
    add("duplicate_role_in_message", b'{"v":1,"id":"a","messages":[{"role":"user","role":"system","content":"x"}]}',
        "json", "reject", "duplicate_key", "messages[0].role")
    # invalid values
    for name, over, field in [
        ("id_empty", {"id": ""}, "id"),
        ("id_control_char", {"id": "a\nb"}, "id"),
        ("prompt_empty", {"prompt": ""}, "prompt"),
        ("messages_empty", {"prompt": None, "messages": []}, "messages"),
        ("tokens_empty", {"prompt": None, "tokens": []}, "tokens"),
        ("stop_entry_empty", {"stop": [""]}, "stop[0]"),
        ("role_unknown", {"prompt": None, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ("reply_to_bad_chars", {"reply_to": "results topic!"}, "reply_to"),
        ("reply_to_dotdot", {"reply_to": ".."}, "reply_to"),
    ]:
        bad_both(name, base(**over), "invalid_value", field)


results = []


def fnv1a64(data):
    """The job content hash (moeq_job_content_hash): FNV-1a 64, 16 lowercase hex digits."""
    h = 14695981039346656037
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def gen_results():
    """Example results (what workers publish), in both formats: for consumers' tests, and fuzz seeds."""
    usage = {"prompt_tokens": 12, "completion_tokens": 3}
    timings = {"queued_ms": 40, "batched_ms": 15, "prefill_ms": 120, "decode_ms": 300, "total_ms": 480}
    cases = {
        "ok_full": {"v": 1, "id": "doc-42/chunk-7", "status": "ok", "text": "A cat.", "tokens": [32, 8415, 13],
                    "finish_reason": "stop_token", "usage": usage, "timings": timings,
                    "model": "deepseek-v3", "worker": "gpu-node-3/0", "metadata": {"tenant": "acme", "doc": 42},
                    "mtp": {"drafted": 2, "accepted": 1, "acceptance": 0.5}},
        "ok_length": {"v": 1, "id": "j2", "status": "ok", "text": "é…", "tokens": [5, 6],
                      "finish_reason": "length", "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
        "error_rejected": {"v": 1, "id": "j3", "status": "error",
                           "usage": {"prompt_tokens": 0, "completion_tokens": 0},
                           "error": {"code": "out_of_range",
                                     "message": "field 'max_new_tokens': 100000 exceeds the cap 8192"}},
        "expired": {"v": 1, "id": "j4", "status": "expired", "finish_reason": "deadline",
                    "usage": {"prompt_tokens": 9, "completion_tokens": 0},
                    "error": {"code": "deadline", "message": "deadline_ms 1767225600000 passed while queued"}},
        # job_hash = FNV-1a 64 of the job's bytes as produced (here: the JSON text {"v":1,"id":"j5","prompt":"hi"})
        "ok_job_hash": {"v": 1, "id": "j5", "status": "ok", "text": "hello", "tokens": [7],
                        "finish_reason": "length", "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                        "job_hash": fnv1a64(b'{"v":1,"id":"j5","prompt":"hi"}')},
        # structured output with logprobs (job fields response_format, logprobs, top_logprobs 2)
        "ok_logprobs": {"v": 1, "id": "j6", "status": "ok", "text": "{\"a\":1}", "tokens": [90, 64, 25, 16, 92],
                        "finish_reason": "stop", "usage": {"prompt_tokens": 5, "completion_tokens": 5},
                        "logprobs": [{"token": t, "logprob": lp, "top_logprobs": [{"token": t, "logprob": lp},
                                                                                  {"token": 7, "logprob": -3.5}]}
                                     for t, lp in ((90, -0.5), (64, -1.25), (25, -0.125), (16, -2.5), (92, -0.25))]},
        # a token that decodes to byte 0x00: text is bytes-exact (msgpack str by length, JSON \u0000)
        "ok_nul_in_text": {"v": 1, "id": "j5", "status": "ok", "text": "a\x00 bre\x00", "tokens": [64, 0, 1627, 0],
                           "finish_reason": "length", "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
    }
    os.makedirs(os.path.join(OUT, "results"))
    for name, r in cases.items():
        for ext, data in (("msgpack", pk(r)), ("json", js(r))):
            rel = f"results/{name}.{ext}"
            with open(os.path.join(OUT, rel), "wb") as f:
                f.write(data)
            entry = {"name": name, "file": rel, "result": r}
            if "\x00" in r.get("text", ""):  # JSON readers in C stop at U+0000: the exact bytes, for them
                entry["text_hex"] = r["text"].encode().hex()
            results.append(entry)


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(os.path.join(OUT, "valid"))
    os.makedirs(os.path.join(OUT, "invalid"))
    gen_valid()
    gen_structured_valid()
    gen_invalid()
    gen_structured_invalid()
    gen_results()
    names = [(v["file"]) for v in vectors]
    assert len(names) == len(set(names)), "duplicate vector file names"
    manifest = {
        "description": "Golden job vectors: see schemas/job.md. Generated by schemas/tools/gen_vectors.py.",
        "version": 1,
        "default_limits": LIM,
        "vectors": vectors,
        "results": results,
    }
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False, sort_keys=False)
        f.write("\n")
    write_seeds()
    print(f"{len(vectors)} vectors in {OUT}", file=sys.stderr)


def write_seeds():
    """Every vector up to 64 KiB as a fuzz seed, prefixed by its content-type byte; results as they are."""
    rseeds = os.path.join(os.path.dirname(SEEDS), "fuzz_result_decode")
    if os.path.isdir(rseeds):
        shutil.rmtree(rseeds)
    os.makedirs(rseeds)
    for r in results:
        shutil.copyfile(os.path.join(OUT, r["file"]), os.path.join(rseeds, r["file"].replace("/", "_")))
    if os.path.isdir(SEEDS):
        shutil.rmtree(SEEDS)
    os.makedirs(SEEDS)
    for v in vectors:
        with open(os.path.join(OUT, v["file"]), "rb") as f:
            data = f.read()
        if len(data) > 65536:
            continue
        ct = SEED_CT.get(v["content_type"], 3)
        name = v["file"].replace("/", "_")
        with open(os.path.join(SEEDS, name), "wb") as f:
            f.write(bytes([ct]) + data)


if __name__ == "__main__":
    main()
