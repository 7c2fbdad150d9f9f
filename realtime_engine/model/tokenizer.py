"""Tokenizer adapter: ``tokenizer.json`` through the ``tokenizers`` library, no network.

Special tokens are resolved by name from the tokenizer's added tokens, never
by hard-coded id. Control tags (``<|emotion:anger|>``...) get no special
treatment here: text is encoded the way the checkpoint's tokenizer encodes it,
which is how the talker was trained and how the reference integration feeds
it. A tokenizer that declares the tags as added tokens turns each into one
id; one that does not spells them out as ordinary text.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from pathlib import Path

from tokenizers import Tokenizer

from realtime_engine.errors import TokenizerError

TOKENIZER_FILE = "tokenizer.json"

TTS = "<|tts|>"
AUDIO = "<|audio|>"
TEXT = "<|text|>"
REF_AUDIO = "<|ref_audio|>"
REF_TEXT = "<|ref_text|>"
END_OF_TEXT = "<|endoftext|>"
AUDIO_END = "<|audio_end|>"

STRUCTURAL_TOKENS = (TTS, AUDIO, TEXT, REF_AUDIO, REF_TEXT, END_OF_TEXT, AUDIO_END)


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the prompt-structure tokens."""

    tts: int
    audio: int
    text: int
    ref_audio: int
    ref_text: int
    eos: int
    audio_end: int

    def all(self) -> frozenset[int]:
        return frozenset(astuple(self))


class HiggsTokenizer:
    """Encodes text for talker prompts and knows the special-token ids."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        added = {tok.content: idx for idx, tok in tokenizer.get_added_tokens_decoder().items()}
        missing = [name for name in STRUCTURAL_TOKENS if name not in added]
        if missing:
            raise TokenizerError(
                "tokenizer lacks the special tokens " + ", ".join(missing),
            )
        self.specials = SpecialIds(
            tts=added[TTS],
            audio=added[AUDIO],
            text=added[TEXT],
            ref_audio=added[REF_AUDIO],
            ref_text=added[REF_TEXT],
            eos=added[END_OF_TEXT],
            audio_end=added[AUDIO_END],
        )
        self._added = added

    @classmethod
    def from_file(cls, path: str | Path) -> HiggsTokenizer:
        path = Path(path)
        if not path.is_file():
            raise TokenizerError(f"tokenizer file {path} does not exist")
        try:
            backend = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exception
            raise TokenizerError(f"cannot read tokenizer {path}: {e}") from e
        return cls(backend)

    @classmethod
    def from_dir(cls, directory: str | Path) -> HiggsTokenizer:
        return cls.from_file(Path(directory) / TOKENIZER_FILE)

    @property
    def backend(self) -> Tokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def added_token_id(self, content: str) -> int | None:
        """Id of an added token by its text (e.g. a control tag), None when absent."""
        return self._added.get(content)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` without any special tokens added around it."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))
