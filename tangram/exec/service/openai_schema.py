"""The OpenAI-style request and answer shapes of EOE's model services, parsed and built without
I/O: ``/v1/completions`` (a teacher's prompt log-probs, as vLLM answers ``echo`` +
``logprobs`` + ``max_tokens: 0``), ``/pooling`` (vLLM's shape, a reward model's score per
input) and OpenRLHF's ``/get_reward`` (``{"query": [...]}`` -> ``{"rewards": [...]}``).

Prompts are text (tokenised with the service's tokenizer) or token ids, one or a list. A bad
request raises ``OpenAiError`` naming the field (``param``), answered in OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}``; nothing is truncated or rewritten.
"""

from __future__ import annotations

import itertools
import math
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The most top log-probs per position a request may ask for (vLLM's default limit).
MAX_LOGPROBS = 20
#: The most prompts in one request.
MAX_PROMPTS = 1024
#: The most tokens of all prompts of one request together: each token costs the model's
#: activations while the call runs and up to ``MAX_LOGPROBS`` + 1 entries in the answer (1024
#: prompts of 256 tokens with 20 log-probs made a 149 MB answer and a 3.7 GB process).
MAX_REQUEST_TOKENS = 65_536
#: A text longer than this many times (the model's length x its longest token) cannot fit
#: whatever its tokens (the factor covers normalisation), so it is refused before tokenising:
#: a 37 MB query took 84 s to tokenise before its length was checked.
TEXT_SLACK = 4


class OpenAiError(Exception):
    """A request the endpoint refuses: HTTP ``status`` and OpenAI's error fields. ``code``
    left out is ``bad_request`` for a 400 (the service's code for the same refusal on its
    other routes), else ``http_<status>``: never null (vLLM's errors always carry a code, and
    a client branching on it could not tell a bad request from anything else)."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        code: str | None = None,
        kind: str = "invalid_request_error",
        retry_after_s: float | None = None,
        should_retry: bool | None = None,
    ) -> None:
        super().__init__(message)
        if code is None:  # (null told a client nothing: every error names what it is)
            code = "bad_request" if status == 400 else f"http_{status}"
        self.message, self.param, self.status, self.code, self.kind = (
            message,
            param,
            status,
            code,
            kind,
        )
        #: A back-off hint for a retryable refusal (429, 503): sent as ``Retry-After``.
        self.retry_after_s = retry_after_s
        #: False for a call that ran (in part or in full): sent as ``x-should-retry``, which
        #: OpenAI's clients obey over their own rule (they retry every 5xx, 408, 409, 429).
        self.should_retry = should_retry

    def headers(self) -> dict[str, str]:
        """``Retry-After`` (whole seconds, at least 1) and ``X-Retry-After-S`` when retryable,
        as the rest of the service sends them; ``x-should-retry`` when it is known."""
        found = {}
        if self.should_retry is not None:
            found["x-should-retry"] = "true" if self.should_retry else "false"
        if self.retry_after_s is None:
            return found
        return {
            **found,
            "Retry-After": str(max(1, math.ceil(self.retry_after_s))),
            "X-Retry-After-S": f"{self.retry_after_s:.3f}",
        }

    def doc(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class Prompt:
    """One prompt as token ids, with its text (given, or decoded from the ids) and where each
    token starts in that text."""

    ids: tuple[int, ...]
    text: str
    offsets: tuple[int, ...]


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompts: tuple[Prompt, ...]
    #: How many top log-probs per position (0: only the prompt tokens' own).
    top: int


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _field(body: Mapping[str, Any], name: str, *, required: bool = False) -> Any:
    if required and name not in body:
        raise OpenAiError(f"'{name}' is a required property", param=name)
    return body.get(name)


def check_body(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise OpenAiError("the request body must be a JSON object")
    return body


def model_name(body: Mapping[str, Any]) -> str:
    model = _field(body, "model", required=True)
    if not isinstance(model, str) or not model:
        raise OpenAiError("'model' must be a non-empty string naming a service", param="model")
    return model


def prompts(value: Any, param: str, frontend: Any) -> tuple[Prompt, ...]:
    """``value`` as prompts: a string, a list of strings, a list of token ids or a list of
    lists of token ids; each non-empty, within the model's vocabulary and length."""
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(_is_int(x) for x in value):
        items = [value]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise OpenAiError(
            f"'{param}' must be a string, a list of strings, a list of token ids or a list of "
            "lists of token ids, and not empty",
            param=param,
        )
    if len(items) > MAX_PROMPTS:
        raise OpenAiError(f"'{param}' has {len(items)} prompts; at most {MAX_PROMPTS}", param=param)
    out = tuple(_prompt(item, f"{param}[{i}]", param, frontend) for i, item in enumerate(items))
    total = sum(len(p.ids) for p in out)
    if total > MAX_REQUEST_TOKENS:
        raise OpenAiError(
            f"'{param}' has {total} tokens in all; one request takes at most "
            f"{MAX_REQUEST_TOKENS} (send fewer prompts per request)",
            param=param,
        )
    return out


def _prompt(item: Any, where: str, param: str, frontend: Any) -> Prompt:
    tok = frontend.tokenizer
    if isinstance(item, str):
        if not item:
            raise OpenAiError(f"'{where}' is an empty string", param=param)
        most = TEXT_SLACK * frontend.max_len * _longest_token(frontend)
        if len(item) > most:
            raise OpenAiError(
                f"'{where}' has {len(item)} characters: more than {frontend.max_len} tokens "
                "of this model can hold",
                param=param,
            )
        ids, offsets = _encode(tok, item, where, param)
        text = item
    elif isinstance(item, list) and item and all(_is_int(x) for x in item):
        bad = [x for x in item if not 0 <= x < frontend.vocab_size]
        if bad:
            raise OpenAiError(
                f"'{where}' has token ids {bad[:5]} outside the model's vocabulary "
                f"[0, {frontend.vocab_size})",
                param=param,
            )
        ids = tuple(item)
        pieces = tok.convert_ids_to_tokens(list(ids))
        # A model's vocabulary is often padded past its tokenizer's: an id in the gap has no
        # token (None), no text and no offset; vLLM refuses it as out of vocabulary too.
        unknown = [x for x, t in zip(ids, pieces, strict=True) if t is None]
        if unknown:
            raise OpenAiError(
                f"'{where}' has token ids {unknown[:5]} that the model's tokenizer has no token "
                "for (outside the tokenizer's vocabulary)",
                param=param,
            )
        text = tok.decode(list(ids))
        again, offsets = _encode(tok, text, where, param)
        if again != ids:  # the text does not tokenise back to these ids: offsets by token
            # text, as the answer's tokens are (``_token_texts``) and as vLLM counts them; by
            # piece ('ĠhÃ©llo', 7 characters for ' héllo') they ran past the text.
            texts = tok.batch_decode(
                [[x] for x in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            offsets = (0, *itertools.accumulate(len(t) for t in texts[:-1]))
    else:
        raise OpenAiError(
            f"'{where}' must be a non-empty string or a non-empty list of token ids", param=param
        )
    if not ids:
        raise OpenAiError(f"'{where}' has no tokens", param=param)
    if len(ids) > frontend.max_len:
        raise OpenAiError(
            f"'{where}' has {len(ids)} tokens; the model takes at most {frontend.max_len}",
            param=param,
        )
    return Prompt(ids, text, tuple(offsets))


def _encode(tok: Any, text: str, where: str, param: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``text``'s token ids and each token's start in it; a text the tokenizer refuses (a
    lone surrogate such as '\\ud800', which is no Unicode character) is the client's error."""
    try:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    except (TypeError, ValueError, UnicodeError) as exc:
        raise OpenAiError(
            f"'{where}' cannot be tokenised ({type(exc).__name__}); is it valid Unicode "
            "text (no lone surrogates)?",
            param=param,
        ) from None
    return tuple(enc["input_ids"]), tuple(a for a, _ in enc["offset_mapping"])


#: Tokenizer -> ``_longest_token`` (computed once per tokenizer; forgotten with it).
_LONGEST: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _longest_token(frontend: Any) -> int:
    """The most characters one token of the front end's vocabulary stands for (its longest
    entry as written in the vocabulary, which is never shorter than its text, plus one for a
    leading space a tokenizer may add)."""
    tok = frontend.tokenizer
    longest = _LONGEST.get(tok)
    if longest is None:
        longest = _LONGEST[tok] = max((len(t) for t in tok.get_vocab()), default=1) + 1
    return longest


def completion_request(body: Any, frontend_of: Any) -> CompletionRequest:
    """A ``/v1/completions`` body for a teacher: ``echo`` true, ``max_tokens`` 0, ``logprobs``
    0..20 (``frontend_of(model)`` gives the service's front end or raises ``OpenAiError``)."""
    body = check_body(body)
    model = model_name(body)
    frontend = frontend_of(model, "teacher")
    if not (_is_int(body.get("max_tokens")) and body["max_tokens"] == 0):
        raise OpenAiError(
            "this service scores prompts and does not generate: send 'max_tokens': 0 with "
            "'echo': true and 'logprobs'",
            param="max_tokens",
        )
    if body.get("echo") is not True:
        raise OpenAiError(
            "'echo' must be true: the answer is the prompt's own log-probs", param="echo"
        )
    top = body.get("logprobs")
    if not _is_int(top) or not 0 <= top <= MAX_LOGPROBS:
        raise OpenAiError(
            f"'logprobs' must be an integer from 0 to {MAX_LOGPROBS}, got {top!r}",
            param="logprobs",
        )
    if body.get("stream"):
        raise OpenAiError("'stream' is not supported", param="stream")
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is not None and not (_is_int(value) and value == 1):
            raise OpenAiError(f"only one choice per prompt ('{name}': 1)", param=name)
    _check_unused_sampling(body)
    return CompletionRequest(
        model, prompts(_field(body, "prompt", required=True), "prompt", frontend), top
    )


#: Sampling parameters a scoring request may carry (clients send their defaults) but that
#: change nothing here: checked as OpenAI checks them, so a wrong value is not ignored.
_SAMPLING_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}


def _check_unused_sampling(body: Mapping[str, Any]) -> None:
    """Refuse sampling settings outside OpenAI's ranges, and ``stop`` / ``logit_bias``,
    which only generation reads (this endpoint generates nothing: they would be ignored)."""
    for name, (low, high) in _SAMPLING_RANGES.items():
        value = body.get(name)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            raise OpenAiError(
                f"'{name}' must be a number from {low:g} to {high:g}, got {value!r}", param=name
            )
    for name in ("stop", "logit_bias", "suffix"):
        if body.get(name):
            raise OpenAiError(
                f"'{name}' applies to generated tokens; this service scores prompts "
                "('max_tokens': 0) and generates none",
                param=name,
            )


def padded(items: Sequence[Prompt], pad: int, top: int | None = None) -> dict[str, Any]:
    """The prompts as one right-padded batch: ``input_ids``, ``attention_mask`` (and ``top_k``)."""
    import torch

    width = max(len(p.ids) for p in items)
    ids = torch.full((len(items), width), pad, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for i, p in enumerate(items):
        ids[i, : len(p.ids)] = torch.tensor(p.ids)
        mask[i, : len(p.ids)] = 1
    batch: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if top:
        batch["top_k"] = torch.full((len(items),), top, dtype=torch.long)
    return batch


def _ident(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


#: vLLM's floor for a log-prob it answers: a token of probability 0 (-inf, e.g. one a model's
#: mask rules out) is -9999.0, since JSON has no infinity (Python's encoder writes
#: ``-Infinity``, which strict parsers, JavaScript's among them, refuse).
LOGPROB_FLOOR = -9999.0


def _floored(logps: list[float]) -> list[float]:
    """``logps`` with -inf raised to ``LOGPROB_FLOOR``, as vLLM's completions do (its
    ``max(logprob, -9999.0)``, which leaves a NaN as it is)."""
    return [LOGPROB_FLOOR if lp < LOGPROB_FLOOR else lp for lp in logps]


def _check_finite(model: str, prompt: int, logps: list[float]) -> None:
    """A 500 naming the prompt if a log-prob of it is NaN or +inf (-inf is floored): it
    went out as ``NaN``, which JSON lacks (strict parsers refused the whole answer, and
    Python's read a NaN that poisons a training step). vLLM's server fails to encode one
    too. The call ran: ``x-should-retry: false`` (``answers_errors``)."""
    if all(math.isfinite(lp) for lp in logps):
        return
    raise OpenAiError(
        f"teacher {model!r} gave a log-prob that is not a finite number for prompt[{prompt}] "
        "(JSON has no NaN or infinity); check the model on that prompt",
        param="prompt",
        status=500,
        code="non_finite_logprob",
        kind="server_error",
    )


def completion_doc(
    req: CompletionRequest, value: Mapping[str, Any], frontend: Any
) -> dict[str, Any]:
    """vLLM's answer to ``echo`` + ``logprobs`` + ``max_tokens: 0``: per prompt, its tokens,
    their log-probs (None for the first, which has no context), the top ``logprobs`` at each
    position (with the prompt's own token) and each token's offset in the text."""
    tok = frontend.tokenizer
    top_ids = None
    if req.top:  # each prompt's own positions (never the batch's padding)
        top_ids = [
            value["top_ids"][i, : len(p.ids) - 1, : req.top].tolist()
            for i, p in enumerate(req.prompts)
        ]
    text_of = _token_texts(tok, req, top_ids)
    choices = []
    for i, p in enumerate(req.prompts):
        n = len(p.ids)
        logps = _floored(value["token_logprobs"][i, : n - 1].tolist())
        _check_finite(req.model, i, logps)
        tokens = [text_of[x] for x in p.ids]
        # As vLLM's, for any ``logprobs`` (0 too): None, then per position the top entries
        # and the prompt's own token (with 0, that token alone).
        top: list[dict[str, float] | None] = [None]
        if top_ids is not None:
            ids_k = top_ids[i]
            lps_k = [_floored(row) for row in value["top_logprobs"][i, : n - 1].tolist()]
            _check_finite(req.model, i, [lp for row in lps_k for lp in row[: req.top]])
        for t in range(n - 1):
            pairs: list[tuple[str, float]] = []
            if top_ids is not None:
                pairs = list(zip((text_of[x] for x in ids_k[t]), lps_k[t][: req.top], strict=True))
            pairs.append((tokens[t + 1], logps[t]))
            # Keyed by text, and distinct ids can share one (a byte-level tokenizer's lone
            # bytes all decode to '\ufffd'): a text keeps the highest log-prob of its ids.
            entry: dict[str, float] = {}
            for text, lp in pairs:
                entry[text] = max(entry.get(text, lp), lp)
            top.append(entry)
        choices.append(
            {
                "index": i,
                "text": p.text,
                "logprobs": {
                    "tokens": tokens,
                    "token_logprobs": [None, *logps],
                    "top_logprobs": top,
                    "text_offset": list(p.offsets),
                },
                "finish_reason": "length",
                "stop_reason": None,
            }
        )
    used = sum(len(p.ids) for p in req.prompts)
    return {
        "id": _ident("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": choices,
        "usage": {"prompt_tokens": used, "completion_tokens": 0, "total_tokens": used},
    }


def _token_texts(
    tok: Any, req: CompletionRequest, top_ids: list[list[list[int]]] | None
) -> dict[int, str]:
    """Each token id of the answer -> its text, as vLLM (and OpenAI) answer tokens: ' world',
    not a byte-level vocabulary's piece 'Ġworld'. Each distinct id is decoded once, in one
    batch (an answer has up to ``MAX_REQUEST_TOKENS`` x (``MAX_LOGPROBS`` + 1) of them)."""
    ids = {x for p in req.prompts for x in p.ids}
    for rows in top_ids or ():
        for row in rows:
            ids.update(row)
    ordered = sorted(ids)
    texts = tok.batch_decode(
        [[x] for x in ordered], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    return dict(zip(ordered, texts, strict=True))


def pooling_doc(model: str, items: Sequence[Prompt], scores: Sequence[float]) -> dict[str, Any]:
    """vLLM's ``/pooling`` answer for a reward model: one score per input."""
    used = sum(len(p.ids) for p in items)
    return {
        "id": _ident("pool"),
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [
            {"index": i, "object": "pooling", "data": [score]} for i, score in enumerate(scores)
        ],
        "usage": {"prompt_tokens": used, "completion_tokens": 0, "total_tokens": used},
    }


def reward_texts(body: Any) -> tuple[str | None, list[str]]:
    """OpenRLHF's ``/get_reward`` body: (its optional ``model``, the ``query`` texts)."""
    body = check_body(body)
    query = _field(body, "query", required=True)
    if not isinstance(query, list) or not query or not all(isinstance(q, str) for q in query):
        raise OpenAiError("'query' must be a non-empty list of strings", param="query")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise OpenAiError("'model' must be a string naming a reward service", param="model")
    return model, query
