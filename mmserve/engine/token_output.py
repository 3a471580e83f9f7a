"""Appending sampled tokens to a request and deciding whether it is finished.

Order of checks per token, as in vLLM: stop token ids and EOS (not detokenized),
then the text (detokenized incrementally, stop strings searched in the new tail),
then max_tokens and the context limit.
"""

from __future__ import annotations

from mmserve.engine.outputs import TokenLogprob
from mmserve.engine.request import Request, Status


class TokenAppender:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def append(
        self,
        req: Request,
        tokens: list[int],
        logprobs: list[list[tuple[int, float]] | None],
        defer_text: bool = False,
    ) -> int:
        """Append tokens until one finishes the request; returns how many were kept.

        ``defer_text`` (a request without stop strings, whose text can finish nothing):
        the kept tokens' text is left for ``catch_up`` unless one of them finishes the
        request. The engine launches its next step in between (async scheduling); the
        detokenizer sees the same tokens one by one either way, so the text is the same."""
        assert not (defer_text and req.stop), "a stop string needs each token's text"
        kept = 0
        for token, lps in zip(tokens, logprobs, strict=True):
            kept += 1
            req.output_ids.append(token)
            req.sampling.observe(token)
            if lps is not None:
                req.pending_logprobs.append(self._logprob(lps))
            if self._check(req, token, defer_text):
                req.status = Status.FINISHED
                break
        return kept

    def catch_up(self, req: Request) -> None:
        """The text of the tokens ``append`` deferred."""
        self._feed(req, len(req.output_ids))

    def _feed(self, req: Request, upto: int) -> str:
        """Detokenize output tokens up to ``upto``, one by one; the newest text."""
        if not req.params.detokenize:  # ids only: nothing to decode
            req.num_detok = max(req.num_detok, upto)
            return ""
        new = ""
        for token in req.output_ids[req.num_detok : upto]:
            new = req.detok.add([token])
            if new:
                req.text += new
        req.num_detok = max(req.num_detok, upto)
        return new

    def _check(self, req: Request, token: int, defer: bool = False) -> bool:
        p = req.params
        n_out = len(req.output_ids)
        if n_out > p.min_tokens or n_out == p.min_tokens:
            if token in p.stop_token_ids:  # a stop or EOS token is never detokenized
                return self._stop(req, "stop", token, n_out - 1)
            if not p.ignore_eos and token in req.eos_ids:
                return self._stop(req, "stop", None, n_out - 1)
        if not defer:
            new = self._feed(req, n_out)
            if new:
                hit = req.stop.check(req.text, len(new))
                if hit.stopped:
                    req.text = req.text[: hit.truncate_to]
                    req.finish_reason, req.stop_reason = "stop", hit.stop_str
                    return True
        if (
            p.max_tokens is not None and n_out >= p.max_tokens
        ) or req.num_tokens >= req.max_total_len:
            return self._stop(req, "length", None, n_out)
        return False

    def _stop(self, req: Request, reason: str, stop_reason: int | None, text_upto: int) -> bool:
        """Finish: the text of the output tokens up to ``text_upto`` (any deferred) in,
        then the detokenizer's held tail."""
        self._feed(req, text_upto)
        req.num_detok = len(req.output_ids)
        tail = req.detok.flush()
        if tail:
            req.text += tail
            hit = req.stop.check(req.text, len(tail))
            if hit.stopped:
                req.text = req.text[: hit.truncate_to]
                reason, stop_reason = "stop", hit.stop_str  # type: ignore[assignment]
        req.finish_reason, req.stop_reason = reason, stop_reason
        return True

    def _logprob(self, lps: list[tuple[int, float]]) -> TokenLogprob:
        tok = self.tokenizer
        (tid, lp), top = lps[0], lps[1:]
        return TokenLogprob(
            tid,
            tok.decode([tid], skip_special_tokens=False),
            lp,
            [(i, tok.decode([i], skip_special_tokens=False), v) for i, v in top],
        )
