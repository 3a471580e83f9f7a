"""xgrammar against llguidance on this engine's tokenizer: compile time, per-token mask time
at batch 1 and 32, rollback, and the constraint kinds each takes.

Usage: ``PYTHONPATH=$PWD python benchmarks/grammar_libs.py [--model-dir DIR] [--json OUT]``
(both libraries installed; the default model's tokenizer from ``~/.cache/mmserve``).

Each library gets the same schemas and the same token streams (a valid document for the
schema, tokenized by the model's own tokenizer). Compile time is cold (a fresh compiler per
schema, no cache). Mask time is the time to fill the bitmask of every matcher of a batch for
one step, then advance each by its token, averaged over the documents' tokens; batch 32 is
32 matchers (8 schemas, 4 copies each), filled one after the other on one thread and, where
the library has one, through its own batched/parallel fill.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

SCHEMAS: dict[str, dict] = {
    "flat": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "enum_array": {
        "type": "object",
        "properties": {
            "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
            "score": {"type": "number"},
        },
        "required": ["colors", "score"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "email": {"type": "string"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["id", "email", "tags"],
                "additionalProperties": False,
            },
            "active": {"type": "boolean"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["user", "active", "note"],
        "additionalProperties": False,
    },
    "defs": {
        "$defs": {
            "Item": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                "required": ["sku", "qty"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
            "total": {"type": "number"},
        },
        "required": ["items", "total"],
        "additionalProperties": False,
    },
    "tool_call": {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
    "any_json": {"type": "object"},
}
DOCS: dict[str, str] = {
    "flat": '{"name": "Ada Lovelace", "age": 36}',
    "enum_array": '{"colors": ["red", "blue", "green", "red"], "score": 0.875}',
    "nested": '{"user": {"id": 42, "email": "ada@example.com", "tags": ["math", "poetry", '
    '"engines"]}, "active": true, "note": null}',
    "defs": '{"items": [{"sku": "A-1", "qty": 2}, {"sku": "B-22", "qty": 10}], "total": 31.5}',
    "tool_call": '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}',
    "any_json": '{"title": "A short story", "words": 120, "genres": ["fable", "myth"]}',
}
REGEX = r"\d{3}-\d{3}-\d{4}"
REGEX_DOC = "555-123-4567"
CHOICES = ["positive", "negative", "neutral"]


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


class XG:
    name = "xgrammar"

    def __init__(self, tokenizer_json: str, vocab_size: int, eos: list[int]) -> None:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        self.xgr = xgr
        hf = PreTrainedTokenizerFast(tokenizer_file=tokenizer_json)
        self.info = xgr.TokenizerInfo.from_huggingface(
            hf, vocab_size=vocab_size, stop_token_ids=eos
        )
        self.vocab = vocab_size

    def compiler(self):
        return self.xgr.GrammarCompiler(self.info, cache_enabled=False)

    def compile_schema(self, c, schema: dict):
        return c.compile_json_schema(json.dumps(schema), strict_mode=True, any_whitespace=False)

    def compile_regex(self, c, regex: str):
        return c.compile_regex(regex)

    def compile_choice(self, c, choices: list[str]):
        ebnf = "root ::= " + " | ".join(json.dumps(ch) for ch in choices)
        return c.compile_grammar(ebnf)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def bitmask(self, n: int):
        return self.xgr.allocate_token_bitmask(n, self.vocab)

    def fill(self, m, mask, i: int) -> None:
        m.fill_next_token_bitmask(mask, i)

    def fill_batch(self, ms, mask) -> None:
        self._batch = getattr(self, "_batch", None) or self.xgr.BatchGrammarMatcher()
        self._batch.batch_fill_next_token_bitmask(ms, mask)

    def accept(self, m, tok: int) -> bool:
        return m.accept_token(tok)

    def rollback(self, m, n: int) -> None:
        m.rollback(n)

    def allowed(self, mask, i: int, tok: int) -> bool:
        return bool((int(mask[i, tok // 32]) >> (tok % 32)) & 1)

    def done(self, m) -> bool:
        return m.is_completed() or m.is_terminated()


class LLG:
    name = "llguidance"

    def __init__(self, tokenizer_json: str, vocab_size: int, eos: list[int]) -> None:
        import llguidance
        import llguidance.numpy as lnp

        self.llg, self.lnp = llguidance, lnp
        text = Path(tokenizer_json).read_text()
        self.tok = llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=eos[0])
        self.vocab = vocab_size
        self.executor = llguidance.LLExecutor()

    def compiler(self):
        return None

    def _check(self, grammar: str) -> str:
        is_error, msgs = self.llg.LLMatcher.validate_grammar_with_warnings(grammar, self.tok)
        if is_error:
            raise ValueError(msgs[0])
        return grammar

    def compile_schema(self, c, schema: dict):
        return self._check(
            self.llg.LLMatcher.grammar_from_json_schema(
                json.dumps(schema),
                defaults={
                    "whitespace_flexible": False,
                    "item_separator": ", ",
                    "key_separator": ": ",
                },
            )
        )

    def compile_regex(self, c, regex: str):
        return self._check(self.llg.LLMatcher.grammar_from_regex(regex))

    def compile_choice(self, c, choices: list[str]):
        lark = "start: " + " | ".join(json.dumps(ch) for ch in choices)
        return self._check(self.llg.LLMatcher.grammar_from_lark(lark))

    def matcher(self, compiled):
        m = self.llg.LLMatcher(self.tok, compiled)
        assert not m.is_error(), m.get_error()
        return m

    def bitmask(self, n: int):
        return self.lnp.allocate_token_bitmask(n, self.vocab)

    def fill(self, m, mask, i: int) -> None:
        self.lnp.fill_next_token_bitmask(m, mask, i)

    def fill_batch(self, ms, mask) -> None:
        self.lnp.fill_next_token_bitmask_par(
            self.executor, [(m, i) for i, m in enumerate(ms)], mask
        )

    def accept(self, m, tok: int) -> bool:
        return m.consume_token(tok)

    def rollback(self, m, n: int) -> None:
        m.rollback(n)

    def allowed(self, mask, i: int, tok: int) -> bool:
        return bool((int(mask[i, tok // 32]) >> (tok % 32)) & 1)

    def done(self, m) -> bool:
        return m.is_stopped() or m.is_accepting()


def compile_times(lib, reps: int = 3) -> dict[str, float]:
    out = {}
    for name, schema in SCHEMAS.items():
        ts = []
        for _ in range(reps):
            c = lib.compiler()
            t = time.perf_counter()
            lib.matcher(lib.compile_schema(c, schema))  # a first matcher: llg compiles lazily
            ts.append(time.perf_counter() - t)
        out[name] = _ms(statistics.median(ts))
    for name, fn, arg in (
        ("regex", lib.compile_regex, REGEX),
        ("choice", lib.compile_choice, CHOICES),
    ):
        c = lib.compiler()
        t = time.perf_counter()
        lib.matcher(fn(c, arg))
        out[name] = _ms(time.perf_counter() - t)
    return out


def streams(lib, encode) -> list[tuple[object, list[int]]]:
    c = lib.compiler()
    out = [(lib.compile_schema(c, SCHEMAS[n]), encode(DOCS[n])) for n in SCHEMAS]
    out.append((lib.compile_regex(c, REGEX), encode(REGEX_DOC)))
    out.append((lib.compile_choice(c, CHOICES), encode("neutral")))
    return out


def mask_times(lib, encode, batch: int, parallel: bool) -> dict:
    """Mean time a step to fill ``batch`` masks (and advance each matcher by its token)."""
    base = streams(lib, encode)
    jobs = [base[i % len(base)] for i in range(batch)]
    ms = [lib.matcher(g) for g, _ in jobs]
    toks = [t for _, t in jobs]
    mask = lib.bitmask(batch)
    steps = max(len(t) for t in toks)
    fill_s, adv_s, valid = [], [], True
    for s in range(steps):
        live = [i for i in range(batch) if s < len(toks[i])]
        t = time.perf_counter()
        if parallel:
            lib.fill_batch(ms, mask)
        else:
            for i in live:
                lib.fill(ms[i], mask, i)
        fill_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        for i in live:
            valid &= lib.allowed(mask, i, toks[i][s])
            valid &= bool(lib.accept(ms[i], toks[i][s]))
        adv_s.append(time.perf_counter() - t)
    return {
        "fill_us_per_step": _us(statistics.mean(fill_s)),
        "fill_us_p50": _us(statistics.median(fill_s)),
        "advance_us_per_step": _us(statistics.mean(adv_s)),
        "steps": steps,
        "docs_accepted": valid,
    }


def rollback_check(lib, encode) -> dict:
    c = lib.compiler()
    g = lib.compile_schema(c, SCHEMAS["nested"])
    toks = encode(DOCS["nested"])
    m, ref = lib.matcher(g), lib.matcher(g)
    mask, ref_mask = lib.bitmask(1), lib.bitmask(1)
    ok = True
    for i, t in enumerate(toks):
        # accept up to 3 tokens ahead, roll them back, then take the true token
        ahead = toks[i : i + 3]
        n = 0
        for a in ahead:
            if not lib.accept(m, a):
                break
            n += 1
        lib.rollback(m, n)
        lib.fill(m, mask, 0)
        lib.fill(ref, ref_mask, 0)
        ok &= bool(np.array_equal(np.asarray(mask), np.asarray(ref_mask)))
        lib.accept(m, t)
        lib.accept(ref, t)
    return {"rollback_equal_to_fresh": ok}


def tool_support(lib) -> dict:
    """Which constraint kinds compile: a tool-call tag wrapping JSON (hermes markup)."""
    out = {}
    try:
        if lib.name == "xgrammar":
            tag = lib.xgr.StructuralTagItem(
                begin="<tool_call>\n", schema=SCHEMAS["tool_call"], end="\n</tool_call>"
            )
            lib.compiler().compile_structural_tag([tag], ["<tool_call>"])
        else:
            lark = 'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json ' + json.dumps(
                SCHEMAS["tool_call"]
            )
            lib.matcher(lib._check(lib.llg.LLMatcher.grammar_from_lark(lark)))
        out["tool_call_markup"] = True
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        out["tool_call_markup"] = f"failed: {exc}"
    try:
        lib.compile_schema(
            lib.compiler(),
            {
                "type": "object",
                "properties": {"x": {"type": "string", "pattern": "^[a-z]+$", "format": "email"}},
            },
        )
        out["unsupported_keyword"] = "accepted"
    except Exception as exc:  # noqa: BLE001
        out["unsupported_keyword"] = f"rejected: {str(exc)[:120]}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--model-dir", default=str(Path.home() / ".cache/mmserve/models/smollm2-135m-instruct")
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from mmserve.models.tokenizer import Tokenizer

    tok = Tokenizer(args.model_dir)
    tj = str(Path(args.model_dir) / "tokenizer.json")
    vocab = tok.backend.get_vocab_size(with_added_tokens=True)
    eos = sorted(tok.eos_token_ids)
    results = {"vocab": vocab}
    for cls in (XG, LLG):
        t = time.perf_counter()
        lib = cls(tj, vocab, eos)
        r: dict = {"tokenizer_setup_ms": _ms(time.perf_counter() - t)}
        r["compile_ms"] = compile_times(lib)
        for b in (1, 32):
            r[f"mask_b{b}_serial"] = mask_times(lib, tok.encode, b, parallel=False)
            r[f"mask_b{b}_batched"] = mask_times(lib, tok.encode, b, parallel=True)
        r.update(rollback_check(lib, tok.encode))
        r.update(tool_support(lib))
        results[cls.name] = r
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
