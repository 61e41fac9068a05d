"""The torch learner backend: one process, CPU or one GPU, an HF causal LM.

Metrics: those of every backend's ``step`` (`._backend`, documented there).
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterator
from pathlib import Path

import structlog
import torch

from ._backend import DIGEST_FILE, TOKENIZER_FILES
from ._batch import TrainBatch, micro_batch_rows
from ._device import resolve_device
from ._digest import checkpoint_digest
from ._distinct_rows import MicroBatch, distinct_rows, paired_micro_batches
from ._grpo import LOSS_SUMS, k3_kl, ppo_clip_loss
from ._learner_state import (
    load_optimizer_state,
    remove_newer_states,
    save_optimizer_state,
    updates_done,
    warmup_lr,
)
from ._lora import LoraSpec
from ._lora_policy import load_policy, save_adapter
from ._memory import release_freed_memory
from ._models import load_causal_lm
from ._scoring import AtTargets, Kept, outputs_at, target_scores, trained_positions
from ._sft import check_objective, sft_gradients
from ._shared_prefix import GroupPrefixes, can_share, group_micro_batch_rows, shared_outputs_at

__all__ = ["TorchLearner"]

log = structlog.get_logger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TorchLearner:
    """GRPO learner on a Hugging Face causal LM (``AutoModelForCausalLM``).

    The update reads like DESIGN.md "The method": score the sampled tokens at
    temperature T, decoupled PPO with the truncated importance weight to the
    rollout logprobs (``ppo_clip_loss``) on the batch's (already
    task-normalised) advantages, k3 KL to a frozen reference, token mean over
    the *whole* batch, clip the gradient norm, AdamW with a linear warmup.
    Micro-batches only bound memory: each one's loss is divided by the token
    count of the whole batch, so accumulating them gives the same gradient as
    one big batch, and one optimiser step per batch makes the proximal policy
    the current weights.

    Resume: with ``state_dir``, ``save`` also writes the AdamW state of the
    saved version (``._learner_state``) and a learner built at that version
    loads it, so its next update equals an uninterrupted learner's.

    LoRA (``lora``, `._lora`): the policy is the base plus trainable adapters, AdamW holds
    the adapters only, the KL reference is the base with the adapters disabled, and
    ``save`` writes the adapters only.

    bfloat16 compute (``bf16_compute``): ``model`` holds the float32 master weights, which
    AdamW updates and ``save`` writes; the forward and backward passes run on ``compute``,
    a bfloat16 copy of them refreshed once per update (one cast per update, not one per
    micro-batch as under autocast; activations, norms and attention in bfloat16, as a
    bfloat16 sampler engine computes them). After each micro-batch its bfloat16 gradients
    are added into the masters' float32 ``.grad`` (`_gather_gradients`). The KL reference
    is a bfloat16 copy of the initial weights.

    Simplified: no entropy bonus, the model runs in ``train()`` mode (set
    dropout to 0 in the model config, as HF causal LMs ship, or the logprob
    gap will not be 0).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        lr: float = 2e-5,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        grad_clip: float = 1.0,
        temperature: float = 0.8,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float | None = 3.0,
        kl_coef: float = 1e-4,
        is_cap: float | None = 2.0,
        warmup_steps: int = 0,
        micro_batch_tokens: int = 4096,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
        gradient_checkpointing: bool = False,
        autocast: bool = False,
        share_prefix: bool | None = None,
        version: int = 0,
        reference_dir: str | Path | None = None,
        state_dir: str | Path | None = None,
        keep_states: int = 2,
        objective: str = "grpo",
        lora: LoraSpec | None = None,
        bf16_compute: bool = False,
        dedup_rows: bool = True,
    ) -> None:
        """``reference_dir``: the frozen KL reference (with ``kl_coef > 0``); default
        ``model_dir``. A run resumed from a checkpoint passes its initial model here, so
        the KL stays to the policy the run started from, not to the resumed weights.
        ``is_cap``: C of the truncated importance weight; ``warmup_steps``: linear lr
        warmup. ``state_dir``: where ``save`` writes the AdamW state (``keep_states``
        newest kept) and from which the state of ``version`` is loaded, if there.
        ``objective``: ``grpo``, or ``sft`` for the supervised warm start (`._sft`).
        ``autocast``: forward passes (policy, reference, scoring) in bfloat16 under
        ``torch.autocast`` while weights, gradients and AdamW stay in ``dtype``, which
        must then be float32; the log-softmax runs in float32 (`._scoring`).
        ``share_prefix``: a group's shared prompt is forwarded once per update, for the
        policy and the reference (`._shared_prefix`; the same gradients), where the model
        allows it (not under gradient checkpointing); None: on a CPU device only.
        ``lora``: train low-rank adapters over a frozen base (`._lora.lora_policy`: the base
        is ``reference_dir``, default ``model_dir``; ``model_dir`` may be an adapter
        checkpoint, which then resumes). The SFT objective refuses it.
        ``bf16_compute``: the passes on a bfloat16 copy of the float32 masters (above);
        needs ``dtype`` float32, no ``autocast`` (it replaces it), no LoRA, objective grpo.
        ``dedup_rows``: rows of a batch alike token for token are forwarded once, for the
        policy and the reference (`._distinct_rows`; the same update); off for a model with
        dropout, whose copies would draw different masks."""

        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if autocast and dtype != "float32":
            raise ValueError(
                f"autocast keeps float32 master weights: dtype must be float32, got {dtype!r}"
            )
        if bf16_compute:
            problem = _bf16_compute_problem(dtype, autocast, lora, objective)
            if problem is not None:
                raise ValueError(f"bf16_compute: {problem}")
        if temperature <= 0:
            raise ValueError(
                f"temperature must be > 0, got {temperature}: the learner scores tokens "
                "under softmax(logits / T); greedy (T = 0) tokens cannot be trained on"
            )
        self.model_dir = Path(model_dir)
        self.grad_clip = grad_clip
        self.temperature = temperature
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.dual_clip = dual_clip
        self.kl_coef = kl_coef
        self.is_cap = is_cap
        self.lr = lr
        self.warmup_steps = warmup_steps
        self.state_dir = None if state_dir is None else Path(state_dir)
        self.keep_states = keep_states
        self.micro_batch_tokens = micro_batch_tokens
        self.objective = check_objective(objective)
        self.autocast = autocast
        self.device = resolve_device(device)  # every tensor of the update goes here
        self.steps = 0  # optimiser updates done so far
        self.version = version  # policy version of the current weights (+1 per step)

        torch.manual_seed(seed)  # global RNG: dropout (if any) and LoRA's A draw from it
        if lora is not None and self.objective == "sft":
            raise ValueError("lora: the SFT warm start trains the whole model; unset lora")
        # with lora: the adapted HF model, its peft wrapper and the frozen base's directory
        self.model, self._peft, self.base_dir = load_policy(
            self.model_dir, lora, reference_dir, dtype=_DTYPES[dtype]
        )
        self.model.to(self.device)
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable()  # non-reentrant: LoRA's grads flow
        self.model.train()
        self.bf16_compute = bf16_compute
        # the module the passes run on: the masters, or their bfloat16 copy
        self.compute = self.model
        self._pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []
        self._compute_stale = False
        if bf16_compute:
            self.compute = copy.deepcopy(self.model).to(torch.bfloat16).train()
            self._pairs = [
                (m, c)
                for (_, m), (_, c) in zip(
                    self.model.named_parameters(), self.compute.named_parameters(), strict=True
                )
            ]
        self.dedup_rows = dedup_rows and not _has_dropout(self.model)
        if dedup_rows and not self.dedup_rows:
            log.info("dedup_rows off: the model has dropout")
        if share_prefix is None:
            share_prefix = self.device.type == "cpu"
        self.share_prefix = share_prefix and can_share(self.model)
        if share_prefix and not self.share_prefix:
            log.info("shared prefix off: the model or gradient checkpointing does not allow it")
        self.reference: torch.nn.Module | None = None  # with lora: the base, adapters off
        self.use_kl = use_kl = kl_coef > 0 and self.objective == "grpo"  # SFT has no KL term
        own_reference = use_kl and lora is None
        if own_reference and reference_dir is not None and Path(reference_dir) != self.model_dir:
            reference = load_causal_lm(Path(reference_dir), dtype=_DTYPES[dtype])
            self.reference = reference.to(self.device).eval().requires_grad_(False)
        elif own_reference:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        if self.reference is not None and bf16_compute:
            self.reference.to(torch.bfloat16)  # the compute copy's initial weights, exactly
        elif self.reference is not None and autocast:
            _linear_weights_in_bfloat16(self.reference)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=lr,
            betas=betas,
            weight_decay=weight_decay,
            fused=True,  # one kernel per step: no transient copy of the moments (bench/)
        )
        if self.state_dir is not None:
            remove_newer_states(self.state_dir, version)
            steps = load_optimizer_state(self.state_dir, version, self.optimizer)
            if steps is not None:
                self.steps = steps
            elif version > 0:
                log.warning("no learner state for this version: fresh AdamW", version=version)
        log.info(
            "learner_loaded",
            model_dir=str(self.model_dir),
            device=str(self.device),
            dtype=dtype,
            autocast=autocast,
            bf16_compute=bf16_compute,
            lora=lora,
        )

    # --- the update -----------------------------------------------------------

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One AdamW update on the whole batch; returns the metrics of `._backend`.

        A batch with no trained token changes no weight and reports zeros; the
        version still advances (the learner actor checkpoints it as the next one).
        The activations it freed go back to the system at its end (`._memory`).
        """
        try:
            return self._step(batch)
        finally:
            release_freed_memory()

    def _step(self, batch: TrainBatch) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        metrics = self.accumulate_gradients(batch)
        self.version += 1
        if metrics["learner/tokens"] == 0:
            log.warning("empty_batch", rows=batch.num_rows)
            metrics["learner/grad_norm"] = 0.0
            return metrics
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        lr = warmup_lr(self.lr, updates_done(self.optimizer), self.warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._compute_stale = self.bf16_compute
        self.steps += 1
        metrics["learner/grad_norm"] = float(grad_norm)
        metrics["learner/lr"] = lr
        return metrics

    def accumulate_gradients(self, batch: TrainBatch) -> dict[str, float]:
        """Forward/backward every micro-batch, adding into ``.grad``; no optimiser step.

        Each micro-batch's summed token loss is divided by the masked token
        count of the *whole* batch, so the accumulated gradient equals the
        gradient of the batch's token-mean loss.
        """
        if self.objective == "sft":  # supervised warm start: token-mean NLL at T = 1
            return sft_gradients(
                self.model,
                batch,
                micro_batch_tokens=self.micro_batch_tokens,
                device=self.device,
                autocast=self.autocast,
            )
        self._refresh_compute()
        total_tokens = batch.num_tokens
        sums = dict.fromkeys(LOSS_SUMS, 0.0)
        count = 0
        distinct = distinct_rows(batch, merge=self.dedup_rows)
        work = batch.select(torch.tensor(distinct.rows, dtype=torch.long))  # what is computed
        pack = group_micro_batch_rows if self.share_prefix else micro_batch_rows
        pairs = paired_micro_batches(batch, distinct, work, pack(work, self.micro_batch_tokens))
        own = ref = None
        if self.share_prefix:  # each group's prompt once per update, for each model
            computes = [pair.compute for pair in pairs]
            own = GroupPrefixes(work, computes, grad=True)
            ref = GroupPrefixes(work, computes, grad=False)
        gather = self._gather_gradients if self.bf16_compute else None
        for pair in _then_done(pairs, own, ref, after=gather):
            count += 1
            micro = pair.loss  # every row, copies included: the loss reads these
            micro_tokens = micro.num_tokens
            if micro_tokens == 0:
                continue
            mask = micro.loss_mask.to(self.device)
            keep = trained_positions(pair.compute, self.device)
            at = self._outputs(self.compute, pair.compute, keep, own)
            logp, entropy = target_scores(  # entropy: [N], no gradient
                at, pair.compute, keep, self.temperature, self.device, entropy=True
            )
            logp = pair.spread(logp)
            old_logp = micro.old_logprobs.to(self.device)
            adv = micro.advantages.to(self.device)
            pg, stats = ppo_clip_loss(  # proximal policy = these weights (one step per batch)
                logp,
                old_logp,
                adv,
                mask,
                self.clip_low,
                self.clip_high,
                self.dual_clip,
                is_cap=self.is_cap,
            )
            pg_sum = pg.sum()
            loss_sum = pg_sum
            if self.use_kl:
                with torch.no_grad():
                    ref_logp = pair.spread(self._reference_logprobs(pair.compute, keep, ref))
                kl_sum = (k3_kl(logp, ref_logp) * mask).sum()
                loss_sum = loss_sum + self.kl_coef * kl_sum
                sums["kl"] += kl_sum.detach().item()
            (loss_sum / total_tokens).backward()

            with torch.no_grad():
                sums["pg"] += pg_sum.detach().item()
                gap = (logp.detach() - old_logp).abs() * mask
                sums["gap"] += gap.sum().item()
                current = micro.versions.to(self.device) == self.version
                sums["gap_cur"] += (gap * current).sum().item()
                sums["n_cur"] += (mask * current).sum().item()
                # [N]: every kept target is a trained one (`trained_positions`), each
                # standing for its row's copies too
                weight = pair.multiplicity().to(self.device)[keep.rows]
                sums["entropy"] += (entropy * weight).sum().item()
            # stats are token means over the micro-batch: weight them back to sums.
            sums["clip"] += float(stats["clip_frac"]) * micro_tokens
            sums["dual"] += float(stats["dual_clip_frac"]) * micro_tokens
            sums["ratio"] += float(stats["ratio_mean"]) * micro_tokens
            sums["approx_kl"] += float(stats["approx_kl"]) * micro_tokens
            sums["is_weight"] += float(stats["is_weight_mean"]) * micro_tokens
            sums["is_clip"] += float(stats["is_clip_frac"]) * micro_tokens

        denom = max(total_tokens, 1)
        metrics = {
            "learner/loss": (sums["pg"] + self.kl_coef * sums["kl"]) / denom,
            "learner/pg_loss": sums["pg"] / denom,
            "learner/approx_kl": sums["approx_kl"] / denom,
            "learner/clip_frac": sums["clip"] / denom,
            "learner/dual_clip_frac": sums["dual"] / denom,
            "learner/ratio_mean": sums["ratio"] / denom,
            "learner/is_weight_mean": sums["is_weight"] / denom,
            "learner/is_clip_frac": sums["is_clip"] / denom,
            "learner/entropy": sums["entropy"] / denom,
            "learner/tokens": float(total_tokens),
            "learner/micro_batches": float(count),
            "learner/row_copies": float(distinct.copies),
            "rollout/logprob_gap": sums["gap"] / denom,
        }
        if sums["n_cur"]:
            metrics["rollout/logprob_gap_current"] = sums["gap_cur"] / sums["n_cur"]
        if self.use_kl:
            metrics["learner/kl"] = sums["kl"] / denom
        return metrics

    def _outputs(
        self,
        model: torch.nn.Module,
        micro: TrainBatch,
        keep: Kept,
        prefixes: GroupPrefixes | None = None,
    ) -> AtTargets:
        """The outputs at the ``keep`` targets, scored chunk by chunk (`._scoring.score`):
        each group's prompt once with ``share_prefix`` (once per update with ``prefixes``)."""
        if self.share_prefix:
            return shared_outputs_at(
                model, micro, keep, self.device, autocast=self.autocast, prefixes=prefixes
            )
        return outputs_at(model, micro, keep, self.device, autocast=self.autocast)

    def _reference_logprobs(
        self, micro: TrainBatch, keep: Kept, prefixes: GroupPrefixes | None = None
    ) -> torch.Tensor:
        """``[b, l]`` logprobs under the KL reference: the frozen copy, or with lora the base
        itself (its head too run with the adapters off)."""
        if self._peft is None:
            at = self._outputs(self.reference, micro, keep, prefixes)
            return target_scores(at, micro, keep, self.temperature, self.device)[0]
        with self._peft.disable_adapter():
            at = self._outputs(self.model, micro, keep, prefixes)
            return target_scores(at, micro, keep, self.temperature, self.device)[0]

    def _refresh_compute(self) -> None:
        """bf16_compute: the bfloat16 copy takes the masters' weights, once per update, and
        drops any gradient an update that raised left on it."""
        for _, compute in self._pairs:
            compute.grad = None
        if not self._compute_stale:
            return
        with torch.no_grad():
            for master, compute in self._pairs:
                compute.copy_(master)
        self._compute_stale = False

    def _gather_gradients(self, micro: TrainBatch | None = None) -> None:
        """bf16_compute: the copy's bfloat16 gradients (one micro-batch's) added into the
        masters' float32 ``.grad``, so the accumulation over micro-batches is in float32."""
        for master, compute in self._pairs:
            if compute.grad is None:
                continue
            if master.grad is None:
                master.grad = compute.grad.to(torch.float32)
            else:
                master.grad.add_(compute.grad)
            compute.grad = None

    # --- scoring ----------------------------------------------------------------

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """``[B, L]`` float32 learner logprob of each target, 0 where ``loss_mask == 0``.

        Aligned like ``batch.old_logprobs``, so it can stand in for them.
        """
        self._refresh_compute()
        out = torch.zeros_like(batch.loss_mask, dtype=torch.float32)
        per_chunk = max(1, self.micro_batch_tokens // max(1, batch.input_ids.shape[1]))
        for start in range(0, batch.num_rows, per_chunk):
            rows = torch.arange(start, min(start + per_chunk, batch.num_rows))
            micro = batch.select(rows)
            keep = trained_positions(micro, self.device)
            at = outputs_at(self.compute, micro, keep, self.device, autocast=self.autocast)
            logp, _ = target_scores(at, micro, keep, self.temperature, self.device)
            out[rows] = logp.float().cpu() * micro.loss_mask
        return out

    # --- checkpoints --------------------------------------------------------------

    def save(self, out_dir: str | Path) -> str:
        """Write an HF safetensors checkpoint to ``out_dir`` (with lora: the adapters only,
        `._lora.save_adapter`); return its digest.

        Copies the tokenizer files found in ``model_dir`` alongside, and
        writes the digest (see ``checkpoint_digest``) to ``out_dir/DIGEST``.
        With ``state_dir``, then writes the AdamW state of this version there.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if self._peft is not None:
            save_adapter(self._peft, out)
        else:
            self.model.save_pretrained(out)
        for name in TOKENIZER_FILES:
            source = self.model_dir / name
            if source.is_file() and not (out / name).exists():
                shutil.copy2(source, out / name)
        digest = checkpoint_digest(out)
        (out / DIGEST_FILE).write_text(digest + "\n")
        log.info("checkpoint_saved", out_dir=str(out), digest=digest, steps=self.steps)
        if self.state_dir is not None:
            save_optimizer_state(
                self.state_dir, self.version, self.optimizer, self.steps, keep=self.keep_states
            )
        return digest


def _linear_weights_in_bfloat16(model: torch.nn.Module) -> None:
    """The frozen reference under autocast: each linear layer's weight and bias stored in
    bfloat16, what autocast casts them to at every call, so the same logits bit for bit
    (a test holds it) without a cast of the model per forward (a frozen weight is not in
    autocast's cache), in about half the memory. A weight tied to the input embedding (an
    LM head) stays: the embedding's lookup does not run under autocast."""
    embedding = model.get_input_embeddings()
    tied = None if embedding is None else embedding.weight
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight is not tied:
            module.weight.data = module.weight.data.to(torch.bfloat16)
            if module.bias is not None:
                module.bias.data = module.bias.data.to(torch.bfloat16)


def _has_dropout(model: torch.nn.Module) -> bool:
    """Whether ``model`` drops anything in training mode: a dropout module with p > 0, or
    an attention dropout in its config (HF attention applies it as a function)."""
    cfg = getattr(model, "config", None)
    if float(getattr(cfg, "attention_dropout", 0.0) or 0.0) > 0:
        return True
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def _bf16_compute_problem(dtype: str, autocast: bool, lora, objective: str) -> str | None:
    """Why ``bf16_compute`` cannot run with these settings, or None."""
    if dtype != "float32":
        return f"keeps float32 master weights: dtype must be float32, got {dtype!r}"
    if autocast:
        return "replaces autocast: set one of them"
    if lora is not None:
        return "trains the whole model: unset lora"
    if objective != "grpo":
        return "runs the grpo objective only: the SFT warm start uses autocast or float32"
    return None


def _then_done(
    micros: list[MicroBatch], *stores: GroupPrefixes | None, after=None
) -> Iterator[MicroBatch]:
    """``micros`` one by one; once the loop's body has run for one (its backward included,
    or its ``continue``), each store's `GroupPrefixes.done` for its computed rows, then
    ``after(micro)`` (the prompts' gradients are in by then)."""
    for micro in micros:
        yield micro
        for store in stores:
            if store is not None:
                store.done(micro.compute)
        if after is not None:
            after(micro)
