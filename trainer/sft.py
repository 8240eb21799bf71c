"""TRL's SFTTrainer with a correctly scaled, token-weighted loss.

Why: transformers 4.55 carries `accepts_loss_kwargs = False` on Gemma3Model
but not on Gemma3ForConditionalGeneration, whose forward takes **kwargs. The
Trainer therefore believes the model normalises its loss by
`num_items_in_batch`, skips the division by the gradient-accumulation steps,
and multiplies by the world size (average_tokens_across_devices), while the
model returns a plain per-micro-batch mean. Reported loss, gradients and
grad norm come out GA x world-size too large, and max_grad_norm clips every
step.

Here the model is called without labels and the loss is the sum of token
cross-entropies divided by the number of loss tokens in the whole optimizer
step across all workers (the count the Trainer computes and all-reduces).
Multiplied by the world size to undo DDP's gradient averaging, the gradient
is exactly that of the global token mean, and the logged loss (the Trainer
sums micro-batch losses, then averages over ranks) is the true token mean.

The LM head runs only at the positions whose next token is a target (the
collator lists them, so no boolean mask is resolved on the device): at batch
4 that skips most of a 262k-wide vocabulary projection, about 8 % of a
step's FLOPs and gigabytes of logits.

Token counts and accuracy are accumulated as tensors and reduced once per
logging step, instead of TRL's three collectives and host syncs per
micro-batch.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Optional, Tuple

from data import IGNORE_INDEX, label_positions


def masked_token_losses(logits, labels) -> Tuple[Any, Any, Any]:
    """(sum of CE over target tokens, number of correct argmaxes, number of targets).

    Only the positions that carry a label are up-cast to fp32, not the whole
    vocabulary-wide logits tensor.
    """
    import torch
    import torch.nn.functional as F

    shift_logits = logits[:, :-1, :]
    shift_labels = labels[:, 1:].to(shift_logits.device)
    mask = shift_labels != IGNORE_INDEX
    sel_logits = shift_logits[mask].float()
    sel_labels = shift_labels[mask]
    if sel_labels.numel() == 0:
        zero = shift_logits.sum() * 0.0
        return zero, torch.zeros((), dtype=torch.long, device=zero.device), torch.zeros(
            (), dtype=torch.long, device=zero.device
        )
    loss_sum = F.cross_entropy(sel_logits, sel_labels, reduction="sum")
    with torch.no_grad():
        correct = (sel_logits.argmax(dim=-1) == sel_labels).sum()
    return loss_sum, correct, mask.sum()


def selected_token_losses(logits, targets) -> Tuple[Any, Any]:
    """(sum of CE, number of correct argmaxes) of logits already taken at the
    target positions only: logits (N, vocab), targets (N,)."""
    import torch
    import torch.nn.functional as F

    logits = logits.float()
    loss_sum = F.cross_entropy(logits, targets, reduction="sum")
    with torch.no_grad():
        correct = (logits.argmax(dim=-1) == targets).sum()
    return loss_sum, correct


@contextlib.contextmanager
def head_at(head, positions) -> Iterator[None]:
    """While active, the LM head (an nn.Module called on hidden states of
    shape (batch, seq, hidden)) sees only the rows positions selects from the
    flattened (batch * seq) hidden states, so the model returns (N, vocab)
    logits. index_select with a known-size index keeps the device in flight."""

    def select(_module, args):
        hidden = args[0]
        return (hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions),) + tuple(args[1:])

    handle = head.register_forward_pre_hook(select)
    try:
        yield
    finally:
        handle.remove()


def token_mean_loss(outputs, labels, num_items_in_batch=None):
    """compute_loss_func contract of transformers' Trainer (also tells it to count loss tokens)."""
    loss_sum, _, count = masked_token_losses(outputs["logits"], labels)
    denom = num_items_in_batch if num_items_in_batch is not None else count.clamp(min=1)
    return loss_sum / denom


def _make_trainer_class(base=None):
    """RaydropSFTTrainer on base: TRL's SFTTrainer unless another class that
    takes the same arguments is given (the GPU benchmark, where TRL is absent,
    gives transformers' Trainer with TRL's PEFT wrapping)."""
    import torch

    if base is None:
        from trl import SFTTrainer as base

    class RaydropSFTTrainer(base):
        """SFTTrainer whose loss and metrics are normalised per token, per step."""

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("compute_loss_func", token_mean_loss)
            super().__init__(*args, **kwargs)
            # The model computes no loss here; nothing must pass loss kwargs to it.
            self.model_accepts_loss_kwargs = False
            self._rd_stats = None  # token counters of this worker, see _rd_add

        def _rd_add(self, tokens, correct, targets: int):
            if self._rd_stats is None:
                # [input tokens, loss tokens] cumulative; [correct, loss tokens] since the last log
                self._rd_stats = torch.zeros(4, dtype=torch.long, device=tokens.device)
            self._rd_stats[0].add_(tokens.detach())
            self._rd_stats[2].add_(correct.detach())
            # A host int added in place: no tensor is built from it on the host
            # and copied over, which would wait for the device.
            self._rd_stats[1::2].add_(targets)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs.pop("labels")
            positions = inputs.pop("label_positions", None)
            targets = inputs.pop("label_targets", None)
            if positions is None:  # a batch the raydrop collator did not make
                positions, targets = label_positions(labels)
            positions = positions.to(labels.device)
            targets = targets.to(labels.device)
            head = self.accelerator.unwrap_model(model).get_output_embeddings()
            with head_at(head, positions):
                outputs = model(**inputs)
            loss_sum, correct = selected_token_losses(outputs.logits, targets)
            # The collator's count, known on the host from the index's shape.
            count = targets.shape[0]
            if num_items_in_batch is not None:
                denom = num_items_in_batch
                if torch.is_tensor(denom):
                    denom = denom.to(loss_sum.device)
                loss = loss_sum / denom
                if self.args.average_tokens_across_devices and self.accelerator.num_processes > 1:
                    loss = loss * self.accelerator.num_processes
            else:
                # No step-wide count: a per-micro-batch mean, averaged over the accumulation.
                loss = loss_sum / max(count, 1) / self.args.gradient_accumulation_steps
            if model.training:
                self._rd_add(inputs["attention_mask"].sum(), correct, count)
            return (loss, outputs) if return_outputs else loss

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> Dict[str, float]:
            """The loss on the held-out rows: the same exact token mean as training
            (summed cross-entropy over every answer token of every row, divided by
            their number, across all workers). Each worker takes rows rank, rank +
            world, ...: no row is counted twice, as a padded distributed sampler would."""
            import time

            from torch.utils.data import DataLoader

            dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
            start = time.time()
            rank, world = self.args.process_index, self.args.world_size
            shard = dataset.select(range(rank, len(dataset), world))
            loader = DataLoader(shard, batch_size=self.args.per_device_eval_batch_size,
                                collate_fn=self.data_collator, shuffle=False)
            model = self.model
            was_training = model.training
            model.eval()
            totals = torch.zeros(2, dtype=torch.float64, device=self.args.device)
            head = self.accelerator.unwrap_model(model).get_output_embeddings()
            with torch.no_grad():
                for batch in loader:
                    batch = self._prepare_inputs(batch)
                    batch.pop("labels")
                    positions, targets = batch.pop("label_positions"), batch.pop("label_targets")
                    with head_at(head, positions):
                        logits = model(**batch).logits
                    loss_sum, _ = selected_token_losses(logits, targets)
                    totals[0].add_(loss_sum.double())
                    totals[1].add_(targets.shape[0])
            if self.accelerator.num_processes > 1:
                totals = self.accelerator.reduce(totals, reduction="sum")
            model.train(was_training)
            loss_sum, tokens = (float(v) for v in totals.tolist())
            metrics = {
                f"{metric_key_prefix}_loss": loss_sum / tokens if tokens else float("nan"),
                f"{metric_key_prefix}_tokens": tokens,
                f"{metric_key_prefix}_rows": float(len(dataset)),
                f"{metric_key_prefix}_runtime": round(time.time() - start, 4),
            }
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

        def _rd_reduce(self) -> Dict[str, float]:
            if self._rd_stats is None:
                stats = torch.zeros(4, dtype=torch.long, device=self.args.device)
            else:
                stats = self._rd_stats.clone()
                self._rd_stats[2:] = 0
            if self.accelerator.num_processes > 1:
                stats = self.accelerator.reduce(stats, reduction="sum")
            tokens, loss_tokens, correct, targets = (int(v) for v in stats.tolist())
            out: Dict[str, float] = {"num_tokens": float(tokens), "num_loss_tokens": float(loss_tokens)}
            if targets:
                out["mean_token_accuracy"] = correct / targets
            return out

        def log(self, logs: Dict[str, float], start_time: Optional[float] = None) -> None:
            # Trainer.log runs on every rank at the same points (its loss gather is
            # collective too), so this reduction cannot deadlock.
            if "loss" in logs or "train_runtime" in logs:
                stats = self._rd_reduce()
                if "train_runtime" in logs:
                    tokens = stats["num_tokens"]
                    logs = {**logs, "train_tokens": tokens, "train_loss_tokens": stats["num_loss_tokens"]}
                    if logs.get("train_runtime"):
                        logs["tokens_per_second"] = tokens / logs["train_runtime"]
                else:
                    logs = {**logs, **stats}
            super().log(logs, start_time)

    return RaydropSFTTrainer


_TRAINER_CLASS = None


def trainer_class():
    """RaydropSFTTrainer, built on first use so that importing this module stays cheap."""
    global _TRAINER_CLASS
    if _TRAINER_CLASS is None:
        _TRAINER_CLASS = _make_trainer_class()
    return _TRAINER_CLASS
