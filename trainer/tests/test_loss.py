"""The loss-scaling fix, in one process (no Ray): gradient accumulation over
four micro-batches must log the token mean, not four times it."""

from __future__ import annotations

import argparse

import pytest

import data
import modeling
import sft
import worker

GA = 4


def _args(tmp_path):
    return argparse.Namespace(
        epochs=1, max_steps=1, per_device_batch_size=1, gradient_accumulation_steps=GA,
        gradient_checkpointing=False, learning_rate=0.0, lr_scheduler="constant", warmup_ratio=0.0,
        max_grad_norm=0.3, logging_steps=1, save_strategy="no", save_steps=100, use_gpu=False, seed=0,
        max_seq_length=512, dataloader_num_workers=0,
    )


def _plain_batches(collator):
    """The collator's batches without the LM-head positions, as a stock trainer takes them."""

    def collate(rows):
        batch = collator(rows)
        batch.pop("label_positions")
        batch.pop("label_targets")
        return batch

    return collate


def _train_one_step(trainer_cls, assets, processor, rows, tmp_path, collator=None):
    model = modeling.load_model(assets["model"], "none", "sdpa", use_gpu=False)
    trainer = trainer_cls(
        model=model, args=worker.sft_config(_args(tmp_path), str(tmp_path)), train_dataset=rows,
        processing_class=processor, data_collator=collator or data.Collator(processor),
        peft_config=modeling.lora_config(8, 16, 0.0),
    )
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    return trainer, logged[0]


@pytest.fixture(scope="module")
def four_rows(dataset):
    return dataset.select(range(GA))


def _expected_token_mean(assets, processor, rows):
    import torch

    model = modeling.load_model(assets["model"], "none", "sdpa", use_gpu=False)
    batch = _plain_batches(data.Collator(processor))([rows[i] for i in range(len(rows))])
    labels = batch.pop("labels")
    with torch.no_grad():
        loss_sum, _, count = sft.masked_token_losses(model(**batch).logits, labels)
    return float(loss_sum / count)


def test_logged_loss_is_the_token_mean(assets, processor, four_rows, tmp_path):
    trainer, first = _train_one_step(sft.trainer_class(), assets, processor, four_rows, tmp_path / "ours")
    assert trainer.model_accepts_loss_kwargs is False
    assert first["loss"] == pytest.approx(_expected_token_mean(assets, processor, four_rows), rel=1e-3)
    assert first["num_loss_tokens"] == sum(
        len(data.encode_text(processor, four_rows[i])[1]) for i in range(GA)
    )


def test_stock_trainer_inflates_by_accumulation(assets, processor, four_rows, tmp_path):
    """The defect being fixed, as transformers 4.55.2 + TRL 0.21 behave."""
    from trl import SFTTrainer

    stock, first = _train_one_step(SFTTrainer, assets, processor, four_rows, tmp_path / "stock",
                                   collator=_plain_batches(data.Collator(processor)))
    # Gemma3ForConditionalGeneration takes **kwargs and lacks accepts_loss_kwargs=False.
    assert stock.model_accepts_loss_kwargs is True
    expected = _expected_token_mean(assets, processor, four_rows)
    assert first["loss"] == pytest.approx(GA * expected, rel=0.1)


def test_lm_head_at_labelled_positions_only(assets, processor, four_rows):
    """The head applied at the collator's positions gives the loss, accuracy
    and gradients of the full logits masked afterwards."""
    import torch

    model = modeling.load_model(assets["model"], "none", "sdpa", use_gpu=False)
    batch = data.Collator(processor)([four_rows[i] for i in range(GA)])
    labels, positions, targets = batch.pop("labels"), batch.pop("label_positions"), batch.pop("label_targets")
    params = [p for p in model.parameters() if p.requires_grad]

    full_sum, full_correct, full_count = sft.masked_token_losses(model(**batch).logits, labels)
    full_sum.backward()
    want = [p.grad.clone() for p in params]
    model.zero_grad(set_to_none=True)

    with sft.head_at(model.get_output_embeddings(), positions):
        logits = model(**batch).logits
    assert logits.shape == (int(full_count), model.config.text_config.vocab_size)
    got_sum, got_correct = sft.selected_token_losses(logits, targets)
    got_sum.backward()
    assert float(got_sum.detach()) == pytest.approx(float(full_sum.detach()), rel=1e-5)
    assert int(got_correct) == int(full_correct)
    for p, w in zip(params, want):
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-6)
    # Outside the context the head is whole again.
    assert model(**batch).logits.shape[:2] == batch["input_ids"].shape


def test_the_loss_reads_nothing_back_and_builds_no_tensor_from_host_values(assets, processor, four_rows, tmp_path):
    """On a GPU, a tensor built from a host value (torch.tensor(n, device=cuda))
    and a value read back (.item(), a boolean mask) each wait for the device;
    compute_loss runs once per micro-batch, so around the model's own forward it
    must do neither. Recorded here on CPU as the operators dispatched."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    model = modeling.load_model(assets["model"], "none", "sdpa", use_gpu=False)
    trainer = sft.trainer_class()(
        model=model, args=worker.sft_config(_args(tmp_path), str(tmp_path)), train_dataset=four_rows,
        processing_class=processor, data_collator=data.Collator(processor),
        peft_config=modeling.lora_config(8, 16, 0.0),
    )
    batch = trainer._prepare_inputs(data.Collator(processor)([four_rows[i] for i in range(2)]))
    inside = []
    trainer.model.register_forward_pre_hook(lambda *a: inside.append(1) and None)
    trainer.model.register_forward_hook(lambda *a: inside.pop() and None)
    syncing = {"aten::lift_fresh", "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select"}
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not inside and func._schema.name in syncing:
                seen.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    trainer.model.train()
    step_count = torch.tensor(100)  # the Trainer's all-reduced count, already a tensor
    with Record():
        for num_items in (step_count, None):
            trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=num_items)
    assert seen == [], seen


def test_batches_go_to_the_gpu_without_waiting():
    args = argparse.Namespace(**vars(_args(None)), lora_r=8)
    args.use_gpu = True
    assert worker.sft_config_kwargs(args, "/tmp/x")["accelerator_config"] == {"non_blocking": True}
    args.use_gpu = False
    assert worker.sft_config_kwargs(args, "/tmp/x")["accelerator_config"] == {"non_blocking": False}
