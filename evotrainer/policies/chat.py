"""Chat templates: an environment's prompt and observations rendered as the turns an instruct model was tuned on,
through the tokenizer's own template (transformers' apply_chat_template), whatever its format."""

from __future__ import annotations

from typing import Any

from evotrainer.errors import ConfigError

# Placeholders that no template rewrites: a turn is rendered around them and cut where they stand.
_A, _B = "\x00EVOTRAINER-ACTION\x00", "\x00EVOTRAINER-OBSERVATION\x00"


def use_chat(tokenizer: Any, setting: str | None, recorded: bool) -> bool:
    """policy.chat_template resolved against the tokenizer: `auto` is on when it has a template; `on` without one
    is a ConfigError; None keeps what a checkpoint recorded."""
    has = bool(getattr(tokenizer, "chat_template", None))
    if setting is None:
        return recorded
    if setting == "on" and not has:
        raise ConfigError("policy.chat_template: on, but the tokenizer has no chat template; set it to auto or off")
    return has if setting == "auto" else setting == "on"


def chat_prompt(tokenizer: Any, text: str) -> str:
    """The prompt as the conversation's first user turn, the assistant's turn opened (the template's own system
    turn, if it adds one, included)."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )


def chat_turn_around(tokenizer: Any, after_eos: bool) -> tuple[str, str]:
    """What goes before and after an observation between two assistant actions: the end of the assistant's turn
    and the opening of a user turn; the user turn's end and the assistant's next turn opened. Found by rendering
    a conversation with placeholders and cutting it where they stand, so any template works. When the policy
    sampled its EOS (the template's end-of-turn token for instruct models), that token is already in the context
    and is dropped here."""
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _A}, {"role": "user", "content": _B}]
    full = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    before = full[full.index(_A) + len(_A) : full.index(_B)]
    after = full[full.index(_B) + len(_B) :]
    eos = getattr(tokenizer, "eos_token", None)
    if after_eos and eos and before.startswith(eos):
        before = before[len(eos) :]
    return before, after
