"""A policy on any Hugging Face causal LM: batched KV-cache sampling with stop strings, token
logprobs, checkpoints, and optional LoRA through peft."""

from __future__ import annotations

import copy
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from evotrainer.errors import ConfigError
from evotrainer.policies.chat import chat_prompt, chat_turn_around, use_chat
from evotrainer.policies.decoders import HFDecoder, KVDecoder, SharedPrefixDecoder, own_decoder_fits
from evotrainer.policies.policy import Sample
from evotrainer.store.checkpoints import damaged
from evotrainer.store.damage import DamagedFile
from evotrainer.store.files import fsync_dir, fsync_tree

POLICY_FILE = "evotrainer_policy.json"
hf_logging.disable_progress_bar()  # our own progress bars say what is happening


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    # Explicit position ids, so left-padded rows are positioned as if unpadded, in sampling and
    # in training alike (otherwise the two disagree and the importance ratio is off from step 0).
    return (mask.cumsum(-1) - 1).clamp(min=0)


def sequence_logprobs(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Logprob of ids[:, 1:] given the prefix: shape [B, T-1]. Differentiable."""
    logits = (
        model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False).logits[:, :-1].float()
    )
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    return logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)


def aside(path: Path, what: str) -> Path:
    """Where save() builds a new checkpoint (`tmp`) or puts the old one while swapping (`old`)."""
    return path.with_name(f"{path.name}.{what}")


def restore_aside(path: Path) -> None:
    """A save killed between renaming the old checkpoint aside and the new one in leaves nothing at
    `path`: put the old one back (the new one was never committed)."""
    old = aside(path, "old")
    if not path.exists() and old.is_dir():
        os.replace(old, path)
        fsync_dir(path.parent)


@dataclass(frozen=True)
class Placement:
    """Where and how a policy's weights live (the policy section's device, dtype, gradient_checkpointing):
    not part of a checkpoint, so a fork or a reload on another worker keeps it only when handed it."""

    device: str = "cpu"
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    sample_dtype: str | None = None  # a low-precision copy samples the training rollouts (policy.sample_dtype)

    def torch_device(self) -> torch.device:
        """The device, checked: one this machine lacks is a ConfigError naming policy.device."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device == "mps" and not torch.backends.mps.is_available():
            raise ConfigError("policy.device: mps requested but torch sees no Apple GPU; set policy.device to cpu")
        if self.device.startswith("cuda"):
            index = int(self.device.split(":")[1]) if ":" in self.device else 0
            if not torch.cuda.is_available() or index >= torch.cuda.device_count():
                seen = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "no CUDA device"
                build = "" if torch.version.cuda else f" (torch {torch.__version__} is a CPU-only build)"
                raise ConfigError(
                    f"policy.device: {self.device} requested but torch sees {seen}{build}; set policy.device to cpu "
                    "or auto, or install a CUDA build of torch"
                )
        return torch.device(self.device)


class HFPolicy:
    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        base_path: str | None = None,
        placement: Placement = Placement(),
        chat: bool = False,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.base_path = base_path  # set when `model` is a LoRA adapter over a base directory
        self.placement = placement
        self.chat = chat  # prompts and observations go through the tokenizer's chat template (chat.py)
        cfg = getattr(model, "config", None)
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 2048) or 2048)
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self._stop_cache: dict[tuple[str, ...], torch.Tensor] = {}
        self._sampler: torch.nn.Module | None = None  # the low-precision copy, made at the first fast sample
        self._sampler_stamp: tuple = ()  # the trainable weights (identity, version) the copy was last synced from

    @property
    def device(self) -> torch.device:
        """Where the weights are now (read, not stored: a trainer may move the model)."""
        return next(self.model.parameters()).device

    # -- loading ---------------------------------------------------------------------------------
    @classmethod
    def load(
        cls, path: str | Path, lora_rank: int = 0, placement: Placement = Placement(), chat: str | None = None
    ) -> HFPolicy:
        """Load a checkpoint written by save(), or any local Hugging Face causal LM directory
        (with a fresh LoRA adapter of `lora_rank` when > 0), onto the placement's device and dtype. `chat`
        (policy.chat_template: auto, on, off) decides whether prompts go through the chat template; None keeps
        what the checkpoint recorded (off for a directory that is not a checkpoint of ours)."""
        path = Path(path)
        restore_aside(path)
        if not (path / "config.json").exists() and not (path / POLICY_FILE).exists():
            raise FileNotFoundError(f"policy.path: {path} is not a model directory (no config.json)")
        if bad := damaged(path):  # named here, not as a loader's traceback from deep inside safetensors or torch
            raise DamagedFile(f"checkpoint file {bad[0][0]}: {bad[0][1]}; restore it, or redo the run that wrote it")
        meta = json.loads((path / POLICY_FILE).read_text()) if (path / POLICY_FILE).exists() else {}
        tok = AutoTokenizer.from_pretrained(path, padding_side="left")
        on = use_chat(tok, chat, bool(meta.get("chat", False)))
        dtype = getattr(torch, placement.dtype)
        if meta.get("lora_base"):
            from peft import PeftModel

            base = AutoModelForCausalLM.from_pretrained(meta["lora_base"], dtype=dtype)
            model = PeftModel.from_pretrained(base, path, is_trainable=True)
            return cls(_placed(model, placement), tok, base_path=meta["lora_base"], placement=placement, chat=on)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        if lora_rank:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model,
                LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules="all-linear", task_type="CAUSAL_LM"),
            )
            return cls(_placed(model, placement), tok, base_path=str(path.resolve()), placement=placement, chat=on)
        return cls(_placed(model, placement), tok, placement=placement, chat=on)

    def save(self, path: str | Path, extra_files: dict[str, bytes] | None = None) -> None:
        """Write model (or LoRA adapter), tokenizer, metadata and `extra_files` (name: bytes) to a temporary
        directory, fsync it, and swap it in for the old checkpoint: the old one is renamed aside, the new
        one renamed in, the parent directory fsynced, and only then is the old one removed. A save killed
        at any point leaves a whole checkpoint, the old or the new one (load() restores one left aside),
        and a checkpoint is on disk when save returns."""
        path = Path(path)
        tmp, old = aside(path, "tmp"), aside(path, "old")
        new_parent = not path.parent.exists()
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        (tmp / POLICY_FILE).write_text(json.dumps({"lora_base": self.base_path, "chat": self.chat}))
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
        fsync_tree(tmp)
        restore_aside(path)  # an earlier save killed mid-swap: its old checkpoint is the current one
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            restore_aside(path)
            raise
        fsync_dir(path.parent)
        if new_parent:  # save_pretrained made it: its own entry must reach the disk too
            fsync_dir(path.parent.parent)
        shutil.rmtree(old, ignore_errors=True)

    def fork(self, path: str | Path) -> HFPolicy:
        self.save(path)
        return HFPolicy.load(path, placement=self.placement)

    # -- text ------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_prompt(self, text: str) -> list[int]:
        """An episode's first context: the environment's prompt, as a user turn with the assistant's turn opened
        when the policy is prompted through its chat template."""
        return self.encode(chat_prompt(self.tokenizer, text) if self.chat else text)

    def wrap_observation(self, obs_ids: list[int], after_eos: bool) -> list[int]:
        """What follows an action in a multi-turn context: the observation's tokens as they are, or, through the
        chat template, inside the end of the assistant's turn (less the EOS the policy sampled, `after_eos`), a
        user turn, and the assistant's next turn opened."""
        if not self.chat:
            return obs_ids
        before, after = chat_turn_around(self.tokenizer, after_eos)
        return self.encode(before) + obs_ids + self.encode(after)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _stop_candidates(self, stop: tuple[str, ...]) -> torch.Tensor:
        """Token ids whose text holds the last character of a stop string: only rows that just
        sampled one of these need the (Python) stop-string check."""
        if stop not in self._stop_cache:
            vocab = len(self.tokenizer)
            ends = {s[-1] for s in stop}
            flags = torch.zeros(max(vocab, self.model.config.vocab_size), dtype=torch.bool)
            for i in range(vocab):
                if any(c in self.tokenizer.decode([i]) for c in ends):
                    flags[i] = True
            self._stop_cache[stop] = flags.to(self.device)
        return self._stop_cache[stop]

    # -- sampling --------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(
        self,
        contexts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: tuple[str, ...] = (),
        greedy: bool = False,
        generator: torch.Generator | None = None,
        fast: bool = False,
    ) -> list[Sample]:
        """All contexts in one batch through an incremental decoder. A prompt shared by several rows (a
        GRPO group) is prefilled once; finished rows stop counting at once and leave the batch when a
        quarter of it has finished, so the tail of long completions does not pay for finished ones.
        `fast`: through the placement's low-precision copy when it names a sample_dtype (training rollouts;
        a held-out read never asks)."""
        n = len(contexts)
        if n == 0:
            return []
        model = self._synced_sampler() if fast and self.placement.sample_dtype else self.model
        was_training = model.training
        model.eval()
        # Per-token results go into preallocated tensors indexed by (original row, step): no Python
        # work per row per token except the stop-string check on the few candidate rows.
        dev = self.device
        tok_buf = torch.full((n, max_new_tokens), -1, dtype=torch.long, device=dev)
        lp_buf = torch.zeros((n, max_new_tokens), device=dev)
        ent = torch.zeros(n, device=dev)
        length = torch.zeros(n, dtype=torch.long, device=dev)
        stopped = torch.zeros(n, dtype=torch.bool, device=dev)
        max_stop = max((len(s) for s in stop), default=0)
        candidates = self._stop_candidates(stop) if stop else None
        generator = _on_device(generator, dev)
        decoder, logits, next_pos = self._prefill(model, contexts, max_new_tokens)
        rows = torch.arange(n, device=dev)  # batch row -> original index
        live = torch.ones(n, dtype=torch.bool, device=dev)  # batch rows still generating
        for t in range(max_new_tokens):
            at = torch.nonzero(live).flatten()
            # Only live rows draw, so the generator's stream does not depend on when rows are dropped.
            tok, logp_all, p_all = _next_token(logits[at], temperature, top_p, greedy, generator)
            r = rows[at]
            tok_buf[r, t] = tok
            lp_buf[r, t] = logp_all.gather(-1, tok[:, None]).squeeze(-1)
            ent.index_add_(0, r, -(p_all * logp_all).sum(-1))
            length[r] = t + 1
            done = self._finished(tok, r, tok_buf, t, stop, max_stop, candidates)
            stopped[r[done]] = True
            live[at[done]] = False
            if t == max_new_tokens - 1 or not live.any():
                break
            step_tok = tok_buf[rows, t].clamp(min=0)  # finished rows feed a placeholder until dropped
            if 4 * int((~live).sum()) >= len(live):
                keep = torch.nonzero(live).flatten()
                decoder.select(keep)
                rows, live, step_tok, next_pos = rows[keep], live[keep], step_tok[keep], next_pos[keep]
            logits = decoder.step(step_tok, next_pos)
            next_pos = next_pos + 1
        model.train(was_training)
        return self._samples(tok_buf, lp_buf, ent, length, stopped)

    @torch.no_grad()
    def _synced_sampler(self) -> torch.nn.Module:
        """The low-precision copy with the trained weights as they are now. Only trainable weights can have
        moved since the copy was made (a LoRA run copies its adapters, a full fine-tune every weight), and only
        when one of them was written in place since the last copy (an optimizer step bumps each tensor's version
        counter): a multi-turn episode samples once a turn, and copies once a step."""
        trainable = [(i, p) for i, p in enumerate(self.model.parameters()) if p.requires_grad]
        stamp = tuple((id(p), p._version) for _, p in trainable)
        if self._sampler is None:
            self._sampler = copy.deepcopy(self.model).to(getattr(torch, self.placement.sample_dtype))
            self._sampler.requires_grad_(False)
        elif stamp != self._sampler_stamp:
            dst = list(self._sampler.parameters())
            for i, src in trainable:
                dst[i].copy_(src)  # cast to the copy's dtype
        self._sampler_stamp = stamp
        return self._sampler

    def _prefill(self, model: torch.nn.Module, contexts: list[list[int]], max_new_tokens: int):
        """A decoder holding each context's cache, the logits after it and each row's next position.
        Identical contexts (a GRPO group's prompt) are run once, and kept once where our decoder fits."""
        unique: dict[tuple[int, ...], int] = {}
        inverse = torch.tensor([unique.setdefault(tuple(c), len(unique)) for c in contexts], device=self.device)
        ids, mask = (t.to(self.device) for t in left_pad([list(c) for c in unique], self.pad_id))
        pos = positions(mask)
        capacity = ids.shape[1] + max_new_tokens
        if not own_decoder_fits(model, capacity):
            decoder = HFDecoder(model)
        else:  # rows sharing a prompt read its cache once (a group's generations)
            decoder = (SharedPrefixDecoder if len(unique) < len(contexts) else KVDecoder)(model, capacity)
        logits = decoder.prefill(ids, mask, pos, inverse)
        return decoder, logits, pos[inverse, -1] + 1

    def _finished(
        self,
        tok: torch.Tensor,
        rows: torch.Tensor,
        tok_buf: torch.Tensor,
        t: int,
        stop: tuple[str, ...],
        max_stop: int,
        candidates: torch.Tensor | None,
    ) -> torch.Tensor:
        """Which batch rows just ended: sampled EOS, or (checked on candidate rows only) completed a stop string."""
        done = tok == self.eos_id if self.eos_id is not None else torch.zeros_like(tok, dtype=torch.bool)
        if candidates is not None:
            for r in torch.nonzero(candidates[tok]).flatten().tolist():
                i = int(rows[r])
                tail = tok_buf[i, max(0, t + 1 - max_stop) : t + 1].tolist()
                if any(s in self.tokenizer.decode(tail, skip_special_tokens=True) for s in stop):
                    done[r] = True
        return done

    def _samples(
        self,
        tok_buf: torch.Tensor,
        lp_buf: torch.Tensor,
        ent: torch.Tensor,
        length: torch.Tensor,
        stopped: torch.Tensor,
    ) -> list[Sample]:
        """One Sample per original row from the per-token buffers, cut at each row's length and decoded."""
        lengths = length.tolist()
        tokens = [row[:k] for row, k in zip(tok_buf.tolist(), lengths)]
        logps = [row[:k] for row, k in zip(lp_buf.tolist(), lengths)]
        texts = self.tokenizer.batch_decode(tokens, skip_special_tokens=True)
        ents, ends = ent.tolist(), stopped.tolist()  # one transfer each, not one per row
        return [
            Sample(tokens[i], logps[i], ents[i], texts[i], "stop" if ends[i] else "length")
            for i in range(len(lengths))
        ]

    @torch.no_grad()
    def logprobs(self, sequences: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        was_training = self.model.training
        self.model.eval()
        ids, mask = (t.to(self.device) for t in left_pad(sequences, self.pad_id))
        lp = sequence_logprobs(self.model, ids, mask, temperature)
        self.model.train(was_training)
        width = ids.shape[1]
        return [lp[i, width - len(s) :].tolist() for i, s in enumerate(sequences)]


def _placed(model: torch.nn.Module, placement: Placement) -> torch.nn.Module:
    model = model.to(placement.torch_device())
    if placement.gradient_checkpointing:
        # Non-reentrant checkpointing: gradients reach LoRA adapters without forcing inputs to require grad.
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.20 renamed it
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _on_device(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator on the sampling device, seeded from the caller's (a CPU generator cannot drive CUDA
    sampling): the same caller seed gives the same draws on the same device."""
    if generator is None or generator.device == device:
        return generator
    seed = int(torch.randint(2**62, (1,), generator=generator))
    return torch.Generator(device).manual_seed(seed)


def _next_token(
    logits: torch.Tensor, temperature: float, top_p: float, greedy: bool, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token, log-probabilities, probabilities) of each row's next token: argmax when greedy, else sampled."""
    if not greedy and temperature != 1.0:
        logits = logits / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    p_all = logp_all.exp()
    if greedy:
        tok = logits.argmax(-1)
    else:
        tok = torch.multinomial(_top_p(p_all, top_p) if top_p < 1.0 else p_all, 1, generator=generator).squeeze(-1)
    return tok, logp_all, p_all


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_p, order = probs.sort(dim=-1, descending=True)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    drop = sorted_p.cumsum(-1) - sorted_p > top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_p)
