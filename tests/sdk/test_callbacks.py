"""The one-line callbacks against a live server: a `transformers.Trainer` and a Lightning Trainer
each train a tiny model built from a config (no download, CPU), and the run appears with its
samples, the tokens the batches train (labels not -100 after the causal shift, whatever the
Trainer's token flag), the loss (with the Trainer's default logging too), a bill > 0, its
held-out evaluations (each at the step and tokens it was taken at), and ends succeeded."""

from __future__ import annotations

import time

import pytest
import torch

from apps.experiments.models import Run
from apps.telemetry.models import RunEvaluation, TelemetrySample
from tests.sdk.conftest import HELD

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STEPS, BATCH, SEQ, VOCAB = 10, 4, 16, 128
EVAL_EVERY = 5  # steps: evaluations at steps 5 and 10


@pytest.fixture(autouse=True)
def one_thread():
    """A model this small trains faster on one thread (and leaves the other core to the server)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def token_rows(n: int, *, seed: int = 0) -> list[dict]:
    """Random token sequences; the last quarter of each is padding (masked out, labelled -100 as
    transformers' language-modelling collator labels it)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        mask = torch.ones(SEQ, dtype=torch.long)
        mask[-SEQ // 4 :] = 0
        labels = ids.masked_fill(mask == 0, -100)
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return rows


# The targets a step trains: each row's real tokens less the first (nothing predicts it).
TOKENS_PER_STEP = BATCH * (SEQ - SEQ // 4 - 1)


def assert_reported(run_id: int, *, tokens: int) -> Run:
    row = Run.objects.get(pk=run_id)
    assert (row.kind, row.status) == ("external", "succeeded"), row.error
    assert row.steps == STEPS and row.tokens == tokens
    assert row.cost_usd > 0 and row.device_seconds > 0
    samples = TelemetrySample.objects.filter(run_id=run_id)
    seqs = sorted(samples.values_list("seq", flat=True))
    assert len(seqs) >= 2 and seqs == list(range(len(seqs)))
    assert samples.exclude(loss=None).exists() and samples.exclude(step_time_s=None).exists()
    return row


def stored_evaluations(run_id: int, metric: str) -> list[RunEvaluation]:
    return list(RunEvaluation.objects.filter(run_id=run_id, metric=metric).order_by("seq"))


def assert_evaluated_at_steps(evaluations: list[RunEvaluation]) -> None:
    """One evaluation per EVAL_EVERY steps, each at the step and the tokens trained by then
    (evaluation's own forward passes are not trained tokens), each on a sample of its own."""
    steps = list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))
    assert [e.step for e in evaluations] == steps
    assert [e.tokens for e in evaluations] == [s * TOKENS_PER_STEP for s in steps]
    assert len({e.seq for e in evaluations}) == len(evaluations)


def tiny_llama(*, hidden: int = 16, layers: int = 1, heads: int = 2):
    """A Llama built from a config (nothing downloaded), small enough for a CPU test."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=SEQ,
        )
    )


def accuracy(prediction) -> dict:
    """Next-token accuracy, for the Trainer's compute_metrics."""
    logits, labels = prediction.predictions, prediction.label_ids
    return {"accuracy": float((logits[:, :-1].argmax(-1) == labels[:, 1:]).mean())}


def test_the_transformers_trainer_reports_through_its_callback(served, tmp_path):
    from transformers import Trainer, TrainingArguments

    from costlab.integrations.transformers import CostlabCallback

    torch.manual_seed(0)
    model = tiny_llama(hidden=32, layers=2, heads=4)
    callback = CostlabCallback(
        experiment=served["experiment"].pk,
        arm="candidate",
        interval_s=0.1,
        quality_metric="accuracy",  # the Trainer's eval_accuracy, stored as "accuracy"
        quality_direction="higher",
        **HELD,
    )
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        eval_strategy="steps",
        eval_steps=EVAL_EVERY,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=token_rows(64),
        eval_dataset=token_rows(8, seed=2),
        compute_metrics=accuracy,
        callbacks=[callback],
    )
    trainer.train()
    assert callback.run_id is not None and callback.run.arm == "candidate"
    row = assert_reported(callback.run_id, tokens=STEPS * TOKENS_PER_STEP)
    assert row.arm.name == "candidate"
    losses = TelemetrySample.objects.filter(run_id=row.pk).exclude(loss=None)
    assert all(0 < s.loss < 10 for s in losses)

    logged = [e for e in trainer.state.log_history if "eval_loss" in e]
    held_out = stored_evaluations(row.pk, "eval_loss")
    assert_evaluated_at_steps(held_out)
    assert [e.value for e in held_out] == pytest.approx([e["eval_loss"] for e in logged])
    assert all(not e.higher_is_better and 0 < e.eval_s < 60 for e in held_out)
    accuracies = stored_evaluations(row.pk, "accuracy")
    assert [e.seq for e in accuracies] == [e.seq for e in held_out]  # one evaluation, both
    assert [e.value for e in accuracies] == pytest.approx([e["eval_accuracy"] for e in logged])
    assert all(e.higher_is_better for e in accuracies)


def test_one_callback_assigns_applies_the_declared_keys_and_tracks_with_default_logging(
    served, tmp_path, capsys
):
    """The documented assignment flow: one object. Only the keys the arm declares reach the
    TrainingArguments, a value the script set is kept and named, `fused_optimizer: false` trains
    the unfused AdamW, and with the Trainer's default logging_steps (500, past this 10-step run)
    the loss is stored at every step, the Trainer's logs (train_loss) as metrics and its
    arguments and model config as hyperparameters. One sampler: every sample of one stream."""
    from transformers import Trainer, TrainingArguments

    from apps.experiments.models import Arm
    from apps.telemetry.models import RunMetric
    from costlab.integrations.transformers import CostlabCallback
    from tests.factories import ArmFactory

    exp = served["experiment"]
    Arm.objects.filter(experiment=exp).update(weight=0)
    ArmFactory(
        experiment=exp,
        name="unfused",
        weight=1,
        strategy_yaml="train: {steps: 10, lr: 0.003}\nkernels: {fused_optimizer: false}\n",
    )
    torch.manual_seed(0)
    model = tiny_llama()
    callback = CostlabCallback(experiment=exp.pk, assign=True, interval_s=0.1, **HELD)
    script = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        learning_rate=1e-3,  # the script's: kept over the arm's 0.003, and said
        per_device_train_batch_size=BATCH,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    args = callback.apply(script)
    assert (args.max_steps, args.learning_rate, args.optim.value) == (STEPS, 1e-3, "adamw_torch")
    assert (args.weight_decay, args.seed, args.warmup_steps) == (
        script.weight_decay,
        script.seed,
        script.warmup_steps,
    )  # the schema's defaults are not the arm's: the script's stay
    assert [c.key for c in callback.mapping.conflicts] == ["train.lr"]
    assert "train.lr: the arm asks learning_rate=0.003" in capsys.readouterr().err
    trainer = Trainer(model=model, args=args, train_dataset=token_rows(64), callbacks=[callback])
    trainer.train()
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    assert not optimizer.defaults.get("fused")
    row = assert_reported(callback.run_id, tokens=STEPS * TOKENS_PER_STEP)
    assert row.arm.name == "unfused" and list(row.streams) == ["0"]
    trained = TelemetrySample.objects.filter(run_id=row.pk, step__gt=0)
    assert trained.exists() and not trained.filter(loss=None).exists()
    final = trainer.state.log_history[-1]["train_loss"]
    metric = RunMetric.objects.get(run_id=row.pk, name="train_loss")
    assert (metric.step, metric.value) == (STEPS, pytest.approx(final))
    assert row.params["hyperparameters"]["max_steps"] == STEPS
    assert row.params["hyperparameters"]["optim"] == "adamw_torch"
    assert row.params["model"]["hidden_size"] == 16


def test_a_trainer_exception_fails_the_run_through_the_callbacks_context(served, tmp_path):
    """The Trainer has no exception event: code that catches what train() raised says so by
    holding the callback as a context manager."""
    from transformers import (
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from costlab.integrations.transformers import CostlabCallback

    class Diverges(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise FloatingPointError("loss is nan at step 3")

    model = tiny_llama()
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        include_num_input_tokens_seen=True,  # counts padding too: costlab's count stays its own
    )
    costlab_cb = CostlabCallback(served["experiment"].pk, "control", interval_s=0.1)
    trainer = Trainer(
        model=model, args=args, train_dataset=token_rows(32), callbacks=[costlab_cb, Diverges()]
    )
    with pytest.raises(FloatingPointError), costlab_cb:
        trainer.train()
    row = Run.objects.get(pk=costlab_cb.run_id)
    assert row.status == "failed" and "loss is nan at step 3" in row.error
    assert row.steps == 3 and row.tokens == 3 * TOKENS_PER_STEP  # trained targets, not padding


def test_lightning_reports_through_its_callback(served):
    import lightning.pytorch as L

    from costlab.integrations.lightning import CostlabCallback

    class TinyLm(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 32)
            self.head = torch.nn.Linear(32, VOCAB)

        def training_step(self, batch, batch_idx):
            # A step of a real model takes time; this one took 1 ms on an AVX-512 CPU, and a run
            # of 12 ms bills under a millionth of a dollar (the bill rounds to 0).
            time.sleep(0.03)
            logits = self.head(self.embed(batch["input_ids"]))[:, :-1]  # predicts the next
            return torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), batch["labels"][:, 1:], ignore_index=-100
            )

        def validation_step(self, batch, batch_idx):
            logits = self.head(self.embed(batch["input_ids"]))
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["labels"])
            self.log("val_loss", loss)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(token_rows(64, seed=1), batch_size=BATCH)
    held_out = torch.utils.data.DataLoader(token_rows(8, seed=2), batch_size=BATCH)
    callback = CostlabCallback(
        experiment=served["experiment"].pk, arm="control", interval_s=0.1, **HELD
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        val_check_interval=EVAL_EVERY,  # and a sanity check first (2 batches): not reported
        callbacks=[callback],
    )
    trainer.fit(TinyLm(), loader, held_out)
    assert callback.run_id is not None
    row = assert_reported(callback.run_id, tokens=STEPS * TOKENS_PER_STEP)
    assert row.arm.name == "control"
    evaluations = stored_evaluations(row.pk, "eval_loss")  # val_loss, by default
    assert_evaluated_at_steps(evaluations)
    assert all(0 < e.value < 10 and e.eval_s > 0 for e in evaluations)
    assert evaluations[-1].value == pytest.approx(float(trainer.callback_metrics["val_loss"]))


def test_a_lightning_exception_fails_the_run(served):
    import lightning.pytorch as L

    from costlab.integrations.lightning import CostlabCallback

    class Diverges(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == 3:
                raise FloatingPointError("loss is nan")
            return self.w(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(32, 4))
    callback = CostlabCallback(experiment=served["experiment"].pk, arm="control", interval_s=0.1)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        callbacks=[callback],
    )
    with pytest.raises(FloatingPointError):
        trainer.fit(Diverges(), torch.utils.data.DataLoader(data, batch_size=4))
    row = Run.objects.get(pk=callback.run_id)
    assert row.status == "failed" and "loss is nan" in row.error and row.steps == 3
