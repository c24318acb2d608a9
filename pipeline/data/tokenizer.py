"""A byte-level BPE tokenizer (Hugging Face `tokenizers`, pinned) trained on the training
part of the text, and the whole text encoded with it.

The text is split once, at the first line break after `1 - data.eval_fraction` of its
characters: the tokenizer learns its merges from the part before, the model trains on
the part before, and every evaluation (held-out loss, head scores, the induction probe,
the ablation) reads the part after, through the same tokenizer. `tokens.npy` holds both
parts, training tokens first; the manifest says where the held-out part starts.

`data.tokenizer.pretrained=hf:ORG/NAME` encodes the text with a model's own tokenizer.json
from the local Hugging Face cache instead (pipeline/hub.py): a public checkpoint's head
scores and ablation then read the held-out text in its own vocabulary. It is tried on a
sample of the text first: one that cannot encode it (a word-level model without an unknown
token) is refused in one line naming it, the reason and the line. The stage refuses a
held-out part too short for one evaluation window (`model.n_ctx` tokens), naming
`data.eval_fraction`: a text with no line break after the split point has none.

Byte-level: every text encodes, nothing is unknown. `data.tokenizer.vocab_size` 256
means bytes alone (no merges). The trainer is deterministic: the same text and size give
the same `tokenizer.json` byte for byte (a test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import hub
from ..config import DataConfig
from ..errors import UserError
from . import corpus

BYTES = 256  # the byte-level alphabet: the smallest vocabulary


@dataclass
class Tokenized:
    tokenizer_json: str  # tokenizer.json, Hugging Face's format
    tokens: np.ndarray  # [n] token ids (uint16), the training part first
    train_tokens: int  # tokens[:train_tokens] come from the training part of the text
    train_chars: int  # where the text was split
    vocab: int  # tokens the tokenizer has (at most the requested vocab_size)


def split_point(text: str, eval_fraction: float) -> int:
    """The start of the first line that begins at or after `1 - eval_fraction` of `text`."""
    cut = int(len(text) * (1.0 - eval_fraction))
    newline = text.find("\n", max(cut - 1, 0))
    return len(text) if newline < 0 else newline + 1


def train(lines: list[str], vocab_size: int):
    """A byte-level BPE tokenizer with at most `vocab_size` tokens, learned from `lines`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(lines, trainer)
    return tok


def encode(tok, lines: list[str], pretrained: str | None = None) -> np.ndarray:
    """Token ids of `lines` concatenated [n] (the pre-tokenizer splits at line breaks anyway).
    `pretrained`: the `data.tokenizer.pretrained` value `tok` came from; a text it cannot encode
    is then one line naming it, the reason and the first line that fails (`require_encodes`)."""
    try:
        encoded = tok.encode_batch(lines, add_special_tokens=False)
    except Exception as e:  # tokenizers raises a bare Exception (a WordLevel model without unk_token)
        if pretrained is None:
            raise
        raise _cannot_encode(tok, lines, pretrained, e) from None
    return np.asarray([i for enc in encoded for i in enc.ids], dtype=np.uint16)


SAMPLE_LINES = 200  # lines of each part of the text a pretrained tokenizer is tried on first


def require_encodes(tok, text: str, cut: int, pretrained: str) -> None:
    """Try a pretrained tokenizer on a sample of the text (the first `SAMPLE_LINES` lines of the
    training and the held-out part) before encoding all of it: a tokenizer.json that loads but
    cannot encode (a word-level model without an unknown token meets a word it lacks) fails here
    in one line, not in a tokenizers traceback after minutes of encoding."""
    for part in (text[:cut], text[cut:]):
        encode(tok, part.splitlines(keepends=True)[:SAMPLE_LINES], pretrained)


def _cannot_encode(tok, lines: list[str], pretrained: str, error: Exception) -> UserError:
    """The refusal for a pretrained tokenizer that failed on `lines`: the reason (tokenizers'
    message) and the first line it fails on, found by encoding them one at a time."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    for line in lines:
        try:
            tok.encode(line, add_special_tokens=False)
        except Exception:  # the same failure, located
            reason += f" (on the line {line.strip()[:60]!r})"
            break
    return UserError(
        "data.tokenizer.pretrained", f"its tokenizer.json cannot encode the text: {reason}", pretrained
    )


def tokenize(
    text: str, vocab_size: int, eval_fraction: float, tok=None, pretrained: str | None = None
) -> Tokenized:
    """Train on the training part of `text` (or use `tok`, the pretrained tokenizer of
    `data.tokenizer.pretrained` = `pretrained`, tried on a sample first: `require_encodes`), then
    encode both parts (module doc)."""
    cut = split_point(text, eval_fraction)
    train_lines = text[:cut].splitlines(keepends=True)
    if tok is not None and pretrained is not None:
        require_encodes(tok, text, cut, pretrained)
    tok = tok or train(train_lines, vocab_size)
    train_ids = encode(tok, train_lines, pretrained)
    eval_ids = encode(tok, text[cut:].splitlines(keepends=True), pretrained)
    return Tokenized(
        tokenizer_json=tok.to_str(pretty=True),
        tokens=np.concatenate([train_ids, eval_ids]),
        train_tokens=len(train_ids),
        train_chars=cut,
        vocab=tok.get_vocab_size(),
    )


def pretrained(value: str):
    """A model's own tokenizer.json from the local Hugging Face cache, and its record."""
    from tokenizers import Tokenizer

    path, record = hub.tokenizer_file(value)
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise UserError(
            str(path), f"not a tokenizer.json the tokenizers library reads ({str(e)[:200]})"
        ) from None
    if tok.get_vocab_size() > np.iinfo(np.uint16).max + 1:
        raise UserError(
            "data.tokenizer.pretrained", f"{tok.get_vocab_size()} tokens: at most 65536 fit tokens.npy", value
        )
    return tok, record


def require_heldout(result: Tokenized, eval_fraction: float, n_ctx: int) -> None:
    """Refuse, where the cause is, a split that leaves no evaluation window (`model.n_ctx` tokens)
    on either side; the train stage would otherwise fail later with less to go on."""
    n_eval = len(result.tokens) - result.train_tokens
    if n_eval == 0:
        problem = (
            "leaves an empty held-out part: the text has no line break after "
            f"{1 - eval_fraction:.0%} of it (the split falls at a line start); add line breaks or raise it"
        )
        raise UserError("data.eval_fraction", problem, eval_fraction)
    if n_eval < n_ctx:
        problem = (
            f"leaves a held-out part of {n_eval} tokens, fewer than one evaluation window "
            f"(model.n_ctx = {n_ctx}): raise it, or use more text"
        )
        raise UserError("data.eval_fraction", problem, eval_fraction)
    if result.train_tokens < n_ctx + 1:
        problem = (
            f"leaves a training part of {result.train_tokens} tokens, fewer than one training window "
            f"(model.n_ctx + 1 = {n_ctx + 1}): lower it, or use more text"
        )
        raise UserError("data.eval_fraction", problem, eval_fraction)


def from_config(data: DataConfig, n_ctx: int) -> tuple[Tokenized | None, dict]:
    """The configured text tokenized, and the manifest the stage writes beside it (what
    was read, with sha256, and where the held-out part starts). None when data.source
    is not text: the stage then records only the source, so that a change to the
    tokenizer's settings reruns no training that does not use it. `n_ctx`: the model's
    context (`require_heldout`)."""
    if data.source != "text":
        return None, {"source": data.source, "used": False}
    text, read = corpus.read(data.text, data.dir)
    if data.text.max_chars is not None:
        text = text[: data.text.max_chars]
        read["max_chars"] = data.text.max_chars
    if not text.strip():
        key, value = ("corpus", data.text.corpus) if data.text.corpus else ("glob", data.text.glob)
        raise UserError(f"data.text.{key}", "no text to tokenize (empty files)", value)
    tok, record = pretrained(data.tokenizer.pretrained) if data.tokenizer.pretrained else (None, None)
    result = tokenize(text, data.tokenizer.vocab_size, data.eval_fraction, tok, data.tokenizer.pretrained)
    require_heldout(result, data.eval_fraction, n_ctx)
    manifest = {
        "source": "text",
        "used": True,
        "text": read,
        "vocab_size": data.tokenizer.vocab_size,
        "vocab": result.vocab,
        "eval_fraction": data.eval_fraction,
        "train_chars": result.train_chars,
        "eval_chars": len(text) - result.train_chars,
        "tokens": int(len(result.tokens)),
        "train_tokens": result.train_tokens,
        "eval_tokens": int(len(result.tokens) - result.train_tokens),
    }
    if record is not None:
        manifest["pretrained"] = record
        del manifest["vocab_size"]  # not used
    return result, manifest


def decode(tokenizer_json: str, ids) -> str:
    """Text of token ids, for reading examples (figures, the report)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json).decode(list(map(int, ids)))
