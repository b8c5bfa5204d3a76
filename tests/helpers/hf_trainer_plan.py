"""Run under torchrun: a user-style HF `Trainer` script using clusterft's WeightedTrainer.

Usage: torchrun --nproc_per_node=2 tests/helpers/hf_trainer_plan.py PARAMS METHOD_DIR OUT_DIR

Trains the tiny built-in model on the selection in METHOD_DIR and writes, per rank,
OUT_DIR/consumed_rank<r>.json (train rows and weights of every step, as the loss saw them)
and, on rank 0, OUT_DIR/log_history.json (the Trainer's logged losses).
"""

import json
import sys
from pathlib import Path

from transformers import DataCollatorForSeq2Seq, TrainingArguments

from clusterft.core.tokens import encode_all
from clusterft.integrations import PlannedSelection, WeightedTrainer
from clusterft.runtime.data import load_examples
from clusterft.runtime.model import base_model_dir, load_model, load_tokenizer
from clusterft.spec.config import load_config


class RecordingTrainer(WeightedTrainer):
    """Logs which train rows (and weights) each step's loss was computed on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.consumed: list[dict] = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        rows = inputs.pop("row")
        if model.training:
            self.consumed.append({"global_step": self.state.global_step, "rows": rows.tolist(),
                                  "weights": inputs["weight"].tolist()})
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def main(params: str, method_dir: str, out_dir: str) -> None:
    out = Path(out_dir)
    cfg = load_config(params)
    tokenizer = load_tokenizer(base_model_dir(cfg), cfg.model)
    model = load_model(base_model_dir(cfg), cfg.model)
    # The user's dataset: the whole train split, tokenized, in file order (index = row).
    encoded = encode_all(load_examples(cfg, "train"), tokenizer, cfg.data.max_length)
    train_ds = [{"input_ids": e.input_ids, "attention_mask": [1] * e.n_tokens, "labels": e.labels, "row": i}
                for i, e in enumerate(encoded)]
    selection = PlannedSelection.load(method_dir)
    args = TrainingArguments(
        output_dir=str(out / "hf"), num_train_epochs=selection.plan.epochs, learning_rate=3e-3,
        lr_scheduler_type="constant", per_device_train_batch_size=4, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
        remove_unused_columns=False,  # keep `row` for the recording above
    )
    trainer = RecordingTrainer(model=model, args=args, train_dataset=train_ds,
                               data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True),
                               selection=selection)
    trainer.train()
    rank = args.process_index
    (out / f"consumed_rank{rank}.json").write_text(json.dumps(trainer.consumed))
    if rank == 0:
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    main(*sys.argv[1:4])
