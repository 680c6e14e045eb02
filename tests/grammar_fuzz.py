#!/usr/bin/env python3
"""Random JSON Schemas against the grammar, every output validated by Python's jsonschema.

  grammar_fuzz.py --walk build/tests/grammar_walk [--schemas N (2000)] [--seed S (5)]

The corpus test (structured_corpus.py) runs curated schemas through a model; this one tries to break the
promise "output valid against the schema, or the schema refused by name" with many schemas a generator makes
from every supported keyword and the combinations that are easy to get wrong: keywords beside enum/const,
keywords on untyped schemas, keywords of one type on another, bounds of any sign and fraction, exclusive
bounds, lengths beside patterns and formats, maps, sets, tuples, allOf merges, oneOf/anyOf, $ref and
recursion. tests/grammar_walk.c writes random complete outputs of each (byte tokens plus multi-byte ones).

Checks (the ctest name): every_random_schemas_output_validates_or_the_schema_is_refused
  - every output of a random response_format regex is a full match under Python's re;
  - every output parses as JSON and validates (Draft 2020-12, its format checker: date, time, date-time,
    email, uuid, ipv4, uri with rfc3987) and is complete;
  - every refusal is unsupported_schema's kind (UNSUPPORTED, FORMAT, LIMIT) with a message;
  - at least 70 % of the schemas compile (the generator stays mostly within the subset).
Exit 0 when all hold, 1 otherwise, 77 when jsonschema is missing.
"""
import argparse
import json
import random
import re
import subprocess
import sys

try:
    import jsonschema
except ImportError:
    print("SKIP: python3-jsonschema is missing")
    sys.exit(77)

FORMATS = ["date", "time", "date-time", "email", "uuid", "ipv4", "uri"]


def num(rng, lo=-50, hi=50):
    return rng.choice([rng.randint(lo, hi), round(rng.uniform(lo, hi), rng.choice([1, 2, 3]))])


def string_schema(rng):
    s = {"type": "string"} if rng.random() < 0.8 else {}
    r = rng.random()
    if r < 0.25:
        s["pattern"] = rng.choice(["^[a-z]+$", "^[A-Z]{2}[0-9]*$", "x", "^(ab|cd)+$", "[0-9]", "^\\w{2,5}$",
                                   # class escapes read as ECMA-262 and as Python's re (jsonschema's): Unicode
                                   # digits, word characters and spaces differ between them
                                   "^\\S+$", "^\\D{1,6}$", "^\\W+$", "^[^\\s]+$", "^[^\\d]{2,}$", "^[^\\w]+$",
                                   "^.{1,5}$", "\\s", "^[\\s\\d]+$", "^[^\\Sa]+$", "^[\\D]+$", "^\\s*x\\s*$"])
    elif r < 0.45:
        s["format"] = rng.choice(FORMATS)
    if rng.random() < 0.5:
        lo = rng.randint(0, 6)
        s["minLength"] = lo
        if rng.random() < 0.7:
            s["maxLength"] = lo + rng.randint(0, 40)
    if "format" in s and s["format"] in ("date", "time", "date-time", "uuid", "ipv4") and "minLength" in s:
        s.pop("minLength")  # keep most of them satisfiable; refusals are fine but rarer
    return s


def number_schema(rng, integer):
    s = {"type": "integer" if integer else "number"} if rng.random() < 0.85 else {}
    lo = num(rng)
    for side in ("lo", "hi"):
        if rng.random() < 0.6:
            excl = rng.random() < 0.4
            v = lo if side == "lo" else round(lo + abs(num(rng, 0, 60)) + (1 if integer else 0.01), 3)
            key = ("exclusiveMinimum" if excl else "minimum") if side == "lo" else \
                  ("exclusiveMaximum" if excl else "maximum")
            s[key] = v
    return s


def enum_schema(rng):
    pool = ["a", "bb", "ccc", "red", "ü", "x y", 1, 2.5, -3, 0, True, False, None, {"k": 1}, [1, "x"], 1000]
    s = {"enum": rng.sample(pool, rng.randint(1, 6))}
    r = rng.random()
    if r < 0.2:
        s["type"] = rng.choice(["string", "integer", "number", ["string", "null"]])
    elif r < 0.45:  # keywords beside enum: each value written only where they admit it
        s.update(rng.choice([{"maxLength": 1}, {"minimum": 1}, {"maximum": 0}, {"pattern": "^[a-c]"},
                             {"minLength": 2}, {"properties": {"k": {"type": "string"}}}]))
    if rng.random() < 0.1:
        s = {"const": rng.choice(pool)}
        if rng.random() < 0.5:
            s.update(rng.choice([{"minimum": 0}, {"maxLength": 2}, {"type": "string"}]))
    return s


def untyped_schema(rng):
    return rng.choice([{}, {"minimum": num(rng)}, {"maximum": num(rng), "exclusiveMinimum": -100},
                       {"maxLength": rng.randint(0, 5)}, {"pattern": "^z"}, {"minItems": 1},
                       {"required": []}, {"additionalProperties": {"type": "integer"}},
                       {"type": "string", "minimum": 3, "items": {"type": "integer"}},
                       {"type": "integer", "pattern": "^1", "maxLength": 1, "format": "int32"},
                       {"type": ["string", "integer"], "maxLength": 2, "minimum": 0},
                       {"type": ["string", "null"], "format": "date"},
                       {"type": ["number", "boolean"], "exclusiveMaximum": 0.5, "enum": [0, 0.5, True, "z", 0.25]}])


def array_schema(rng, depth):
    r = rng.random()
    if r < 0.2:  # a set over a finite domain
        items = rng.choice([{"enum": ["a", "b", "c", 1, 1.0]}, {"type": "boolean"},
                            {"type": "integer", "minimum": -2, "maximum": 4}, {"enum": ["x", "y"], "type": "string"}])
        s = {"type": "array", "items": items, "uniqueItems": True}
    elif r < 0.35:  # a tuple
        s = {"type": "array", "prefixItems": [gen(rng, depth - 1) for _ in range(rng.randint(1, 3))]}
        if rng.random() < 0.5:
            s["items"] = rng.choice([False, gen(rng, depth - 1)])
    else:
        s = {"type": "array", "items": gen(rng, depth - 1)}
    if rng.random() < 0.5:
        s["minItems"] = rng.randint(0, 2)
    if rng.random() < 0.6:
        s["maxItems"] = s.get("minItems", 0) + rng.randint(0, 3)
    return s


def object_schema(rng, depth):
    r = rng.random()
    if r < 0.2:  # a map
        s = {"type": "object", "additionalProperties": gen(rng, depth - 1)}
        if rng.random() < 0.4:
            s["propertyNames"] = rng.choice([{"pattern": "^[a-z]{1,4}$"}, {"enum": ["k1", "k2", "k3"]},
                                             {"maxLength": 3}])
        if rng.random() < 0.4:
            s["minProperties"] = rng.randint(0, 2)
        if rng.random() < 0.4:
            s["maxProperties"] = s.get("minProperties", 0) + rng.randint(0, 2)
        return s
    props = {f"p{i}": gen(rng, depth - 1) for i in range(rng.randint(1, 4))}
    s = {"type": "object", "properties": props, "required": [p for p in props if rng.random() < 0.5]}
    a = rng.random()
    if a < 0.3:
        s["additionalProperties"] = False
    elif a < 0.4:
        s["additionalProperties"] = rng.choice([True, {"type": "string"}])
    if rng.random() < 0.15:  # allOf: a base and an extension
        base = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0}}, "required": ["id"]}
        s = {"allOf": [base, s]}
    return s


def gen(rng, depth):
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "untyped"]
    if depth > 0:
        kinds += ["object", "object", "array", "anyOf", "oneOf", "ref"]
    k = rng.choice(kinds)
    if k == "string":
        return string_schema(rng)
    if k in ("integer", "number"):
        return number_schema(rng, k == "integer")
    if k == "boolean":
        return {"type": "boolean"}
    if k == "null":
        return {"type": "null"}
    if k == "enum":
        return enum_schema(rng)
    if k == "untyped":
        return untyped_schema(rng)
    if k == "array":
        return array_schema(rng, depth)
    if k == "object":
        return object_schema(rng, depth)
    if k == "anyOf":
        return {"anyOf": [gen(rng, depth - 1) for _ in range(rng.randint(2, 3))]}
    if k == "oneOf":  # branches told apart by type
        types = rng.sample(["string", "integer", "boolean", "null", "array"], rng.randint(2, 3))
        return {"oneOf": [{"type": t} for t in types]}
    return {"$ref": "#/$defs/Node"}


def schema(rng):
    s = gen(rng, rng.randint(1, 3))
    if "$ref" in json.dumps(s) or rng.random() < 0.1:  # a recursive definition for the refs to name
        node = {"type": "object", "properties": {"v": {"type": "integer"},
                                                 "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"},
                                                          "maxItems": 2}},
                "required": ["v"]}
        s = {"$defs": {"Node": node}, "allOf": [s]} if "$ref" not in s else dict(s, **{"$defs": {"Node": node}})
    return s


def regex(rng, depth=3):
    """A random pattern of the supported syntax (response_format regex: the whole output matches)."""
    atoms = ["a", "b", "x", "0", "é", "日", "\\.", "-", " ", ".", "\\d", "\\w", "\\s", "\\D", "\\W", "\\S",
             "[a-c]", "[^a-c]", "[\\d_]", "[^\\s]", "[^\\w-]", "\\n", "\\t", "\\u00e9", "\\x41", "[\\u0100-\\u0105]"]
    parts = []
    for _ in range(rng.randint(1, 4)):
        if depth > 0 and rng.random() < 0.25:
            a = "(" + "|".join(regex(rng, depth - 1) for _ in range(rng.randint(1, 3))) + ")"
            # a group gets no unbounded quantifier: Python's backtracking re takes exponential time on (a*)*
            parts.append(a + rng.choice(["", "?", "{2}", "{0,2}"]))
            continue
        a = rng.choice(atoms)
        q = rng.random()
        if q < 0.15:
            a += "*"
        elif q < 0.3:
            a += "+"
        elif q < 0.4:
            a += "?"
        elif q < 0.5:
            lo = rng.randint(0, 3)
            a += rng.choice(["{%d}" % lo, "{%d,}" % lo, "{%d,%d}" % (lo, lo + rng.randint(0, 3))])
        parts.append(a)
    return "".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--walk", required=True)
    ap.add_argument("--schemas", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    schemas = [schema(rng) for _ in range(a.schemas)]
    patterns = [regex(rng) for _ in range(a.schemas // 4)]
    text = "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in schemas)
    text += "".join("regex:" + p + "\n" for p in patterns)
    res = subprocess.run([a.walk, "--seed", str(a.seed)], input=text.encode(), capture_output=True, check=True)
    lines = [json.loads(l) for l in res.stdout.decode().split("\n") if l]  # not splitlines: U+2028 is data
    if len(lines) != len(schemas) + len(patterns):
        print(f"FAIL: {len(lines)} answers for {len(schemas)} schemas and {len(patterns)} patterns")
        return 1
    failures, regex_outputs = 0, 0
    for line in lines[len(schemas):]:  # regexes: every output a full match under Python's re
        p = patterns[line["i"] - len(schemas)]
        if "error" in line and line["code"] not in ("unsupported", "parse", "limit"):
            failures += 1
            print(f"FAIL: regex {p!r} refused with {line['code']}: {line['error']}")
        for out in line.get("outputs", []):
            regex_outputs += 1
            if isinstance(out, dict) or not re.fullmatch(p, out):
                failures += 1
                if failures <= 20:
                    print(f"FAIL: regex {p!r}: output {out!r} is not a full match")
    lines = lines[:len(schemas)]
    cls = jsonschema.Draft202012Validator
    compiled, outputs, refused = 0, 0, {}
    for line in lines:
        s = schemas[line["i"]]
        if "error" in line:
            if line["code"] not in ("unsupported", "format", "limit") or not line["error"]:
                failures += 1
                print(f"FAIL: schema {line['i']} refused with {line['code']}: {line['error']}\n  {json.dumps(s)}")
            key = line["error"].split(" at ")[0][:70]
            refused[key] = refused.get(key, 0) + 1
            continue
        compiled += 1
        v = cls(s, format_checker=cls.FORMAT_CHECKER)
        for out in line["outputs"]:
            outputs += 1
            why = None
            if isinstance(out, dict):
                why, out = "incomplete within the budget", out["incomplete"]
            else:
                try:
                    val = json.loads(out)
                    errs = list(v.iter_errors(val))
                    if errs:
                        why = errs[0].message
                except json.JSONDecodeError as e:
                    why = f"not JSON: {e}"
            if why:
                failures += 1
                if failures <= 20:
                    print(f"FAIL: schema {line['i']}: {why}\n  schema {json.dumps(s)[:400]}\n  output {out[:300]}")
    share = compiled / len(schemas)
    print(f"{len(patterns)} regexes: {regex_outputs} outputs matched")
    print(f"{len(schemas)} schemas: {compiled} compiled ({share:.0%}), {outputs} outputs validated; refused:")
    for k, n in sorted(refused.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {n:4d}  {k}")
    if share < 0.7:
        print("FAIL: fewer than 70 % of the schemas compiled")
        failures += 1
    print("PASS" if not failures else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
